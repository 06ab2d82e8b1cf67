"""The FastAPI app factory: `create_app(settings)`; nothing is built at import time."""

from __future__ import annotations

import importlib.resources
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException

from rofu.service.api.decoding import is_json
from rofu.service.api.deps import ClientAuth
from rofu.service.api.middleware import (
    AuthenticationMiddleware,
    BodyLimitMiddleware,
    MetricsMiddleware,
)
from rofu.service.api.routes import (
    admin,
    arms,
    decisions,
    events,
    health,
    metrics,
    model,
    personalizer,
    report,
    reward,
    select,
)
from rofu.service.db.faults import DatabaseFaults, as_unavailable, is_outage
from rofu.service.errors import (
    InvalidInput,
    ServiceError,
    Unavailable,
    UnsupportedMediaType,
    error_response,
)
from rofu.service.personalizer.schemas import is_facade, reshape
from rofu.service.runtime import Runtime
from rofu.service.settings import Settings, get_settings

log = logging.getLogger("rofu.app")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service for `settings` (default: from the environment)."""
    settings = settings or get_settings()
    runtime = Runtime(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:  # a start that fails half-way still stops what it started
            await runtime.start()
            yield
        finally:
            await runtime.aclose()

    docs = settings.docs_access
    app = FastAPI(
        title="rofu",
        version="1",
        summary="Online recommendations with ROFU exploration",
        lifespan=lifespan,
        docs_url=None,  # served from the package's own copy below, never from a CDN
        redoc_url=None,
        openapi_url="/openapi.json" if docs == "open" else None,
    )
    app.state.runtime = runtime
    for router in (
        select.router,
        reward.router,
        events.router,
        arms.router,
        model.router,
        decisions.router,
        report.router,
        admin.router,
        personalizer.router,  # the Personalizer-compatible facade, /personalizer/v1.0/...
        health.router,
        metrics.router,
    ):
        app.include_router(router)  # each owns its prefix: /v1/..., or none for probes
    if docs == "open":
        _offline_docs(app)
    if docs == "key":
        _keyed_schema(app)
    _install_error_handlers(app, runtime.faults)
    # the last added runs first: metrics, then keys (401), then the body limit (413)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AuthenticationMiddleware, keys=runtime.keys, public=_public_paths(docs))
    app.add_middleware(MetricsMiddleware, metrics=runtime.metrics)
    return app


DOCS_ASSETS = "/docs-assets"


def _public_paths(docs: str) -> frozenset[str]:
    """What needs no key: the probes and metrics, and the docs when `ROFU_DOCS` is open
    (`/docs-assets/` is a prefix)."""
    probes = (route for router in (health.router, metrics.router) for route in router.routes)
    public = {route.path for route in probes if isinstance(route, APIRoute)}
    if docs == "open":
        public |= {"/docs", "/redoc", "/openapi.json", f"{DOCS_ASSETS}/"}
    return frozenset(public)


def _offline_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc from the files of the `fastapi-offline` package, so
    the pages work with no network."""
    assets = importlib.resources.files("fastapi_offline") / "static"
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(assets)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="rofu API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="/openapi.json",
            title="rofu API",
            redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )


def _keyed_schema(app: FastAPI) -> None:
    """Serve /openapi.json to holders of a client API key only (ROFU_DOCS=key)."""

    @app.get("/openapi.json", include_in_schema=False, dependencies=[ClientAuth])
    async def openapi_schema() -> JSONResponse:
        return JSONResponse(app.openapi())


HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


def _allowed_methods(request: Request) -> str | None:
    """Every method the schema documents for the request's path, for a 405's `Allow`.

    Starlette names only the methods of the first route matching the path, while /v1/arms
    and /v1/admin/pin are served by one route per method.
    """
    paths: dict[str, dict[str, Any]] = request.app.openapi().get("paths", {})
    for template, operations in paths.items():
        pattern = "[^/]+".join(re.escape(part) for part in re.split(r"\{[^/}]+\}", template))
        if re.fullmatch(pattern, request.url.path):
            return ", ".join(sorted(m.upper() for m in operations if m in HTTP_METHODS))
    return None


JSON = "application/json"


def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """The request validation's error: a 415 for a body not sent as JSON, else a 422
    (`InvalidInput`) naming the first invalid field, a missing body or the JSON error."""
    errors = exc.errors()
    first: dict[str, Any] = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    body = _body_error(errors, request.headers.get("content-type", ""))
    if body is not None:
        return body.response()
    if first.get("type") == "json_invalid":  # loc is ("body", character offset)
        offset = first["loc"][-1]
        reason = first.get("ctx", {}).get("error", "JSON decode error")
        message = f"body: not valid JSON at character {offset} ({reason})"
        return InvalidInput(message, field="body").response()
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    field = ".".join(location) or "body"
    return InvalidInput(f"{field}: {first.get('msg')}", field=field).response()


def _body_error(errors: Sequence[Any], content_type: str) -> ServiceError | None:
    """The error of a body missing, or not sent as JSON (FastAPI then hands the model its
    raw bytes, which fail as a whole); None when the body itself was read."""
    whole = next((e for e in errors if tuple(e.get("loc", ())) == ("body",)), None)
    if whole is None:
        return None
    if whole.get("type") == "missing":
        message = f"body: required: send a JSON object with content-type {JSON}"
        return InvalidInput(message, field="body")
    if is_json(content_type):
        return None  # JSON, but not an object: the field's own error
    got = repr(content_type) if content_type else "none"
    message = f"body: the content-type must be {JSON} (got {got})"
    return UnsupportedMediaType(message, field="content-type")


def _install_error_handlers(app: FastAPI, faults: DatabaseFaults) -> None:
    """One handler per kind of error; the facade's paths get Personalizer's error shape."""

    def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        if isinstance(exc, Unavailable):  # a database outage is counted and logged
            faults.record_exception(exc, f"{request.method} {request.url.path}")
        return exc.response()

    def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request) or headers.get("Allow", "")
        return error_response(exc.status_code, code, str(exc.detail), headers=headers or None)

    def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", "internal error")

    def database_error(request: Request, exc: SQLAlchemyError) -> JSONResponse:
        if not is_outage(exc):  # a bug (integrity, programming): a 500
            return unexpected(request, exc)
        unavailable = as_unavailable(exc)
        unavailable.__cause__ = exc
        return service_error(request, unavailable)

    handlers: dict[type[Exception], Callable[[Request, Any], JSONResponse]] = {
        ServiceError: service_error,
        RequestValidationError: _invalid_request,
        HTTPException: http_error,
        Exception: unexpected,
        SQLAlchemyError: database_error,
    }
    for kind, handler in handlers.items():
        app.add_exception_handler(kind, _shaped(handler))


def _shaped(
    handler: Callable[[Request, Any], JSONResponse],
) -> Callable[[Request, Any], Awaitable[JSONResponse]]:
    """`handler` as an exception handler whose answers on the Personalizer-compatible
    facade's paths take Personalizer's error shape."""

    async def handle(request: Request, exc: Any) -> JSONResponse:
        response = handler(request, exc)
        path = request.url.path
        return reshape(response, path) if is_facade(path) else response

    return handle
