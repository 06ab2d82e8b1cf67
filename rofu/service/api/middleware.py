"""Raw ASGI middleware: a request body limit and per-route Prometheus metrics."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rofu.service.errors import PayloadTooLarge
from rofu.service.metrics import ServiceMetrics
from rofu.service.personalizer.schemas import is_facade, reshape


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
            await self._refuse(scope, receive, send)
            return
        body, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
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

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = PayloadTooLarge(f"request body exceeds {self.max_bytes} bytes").response()
        if is_facade(scope["path"]):  # the Personalizer-compatible facade's error shape
            response = reshape(response)
        await response(scope, receive, send)


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
