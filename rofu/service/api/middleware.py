"""Raw ASGI middleware: per-route Prometheus metrics, authentication, a request body limit.

They run in that order, before the app reads anything: the metrics count every answer, a
request without a valid key is a 401 whatever its body, then a body over the limit is a
413; only then do the routes check the content type (415) and the body (422).
"""

from __future__ import annotations

import time
from collections.abc import Collection

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rofu.service.api.security import KEY_HEADERS, SUBSCRIBER_KEY_HEADERS, KeyRing, authorise
from rofu.service.errors import PayloadTooLarge, ServiceError, Unauthorized
from rofu.service.metrics import ServiceMetrics
from rofu.service.personalizer.schemas import is_facade, reshape


async def _refuse(error: ServiceError, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer `error` without the app, in the facade's error shape on the facade's paths."""
    response = error.response()
    if is_facade(scope["path"]):
        response = reshape(response)
    await response(scope, receive, send)


class AuthenticationMiddleware:
    """Refuse a request without a valid API key with 401 before its body is read.

    With keys configured, every path needs a client or admin key but the `public` ones (an
    entry ending in `/` is a prefix): an unknown path too, so an anonymous caller learns
    neither the paths nor the schema. Whether the key's role may call the route (403) is
    the route's dependencies' to say.
    """

    def __init__(self, app: ASGIApp, keys: KeyRing, public: Collection[str]) -> None:
        self.app = app
        self.keys = keys
        self.exact = frozenset(path for path in public if not path.endswith("/"))
        self.prefixes = tuple(path for path in public if path.endswith("/"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.keys.open and not self._public(scope["path"]):
            headers = SUBSCRIBER_KEY_HEADERS if is_facade(scope["path"]) else KEY_HEADERS
            try:
                authorise(self.keys, HTTPConnection(scope), admin=False, headers=headers)
            except Unauthorized as exc:
                await _refuse(exc, scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _public(self, path: str) -> bool:
        return path in self.exact or path.startswith(self.prefixes)


class BodyLimitMiddleware:
    """Refuse bodies over `max_bytes` with 413 before the app sees them."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _refuse(self._too_large(), scope, receive, send)
            return
        body, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _refuse(self._too_large(), scope, receive, send)
                return
            body.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(body), "more_body": False}

        await self.app(scope, replay, send)

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body exceeds {self.max_bytes} bytes")


class MetricsMiddleware:
    """Count requests and time them by route template, method and status."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unmatched"
            labels = (endpoint, scope["method"], str(status))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.latency.labels(*labels).observe(time.perf_counter() - start)
