"""The service's error hierarchy, and the one shape of every error body.

ServiceError (500)
├── InvalidInput (422)          bad input: a field the schema refuses (`invalid_input` for
│                               the request validation's errors too), a value it cannot
│                               see (e.g. context length), a body that is not valid JSON
├── NotFound (404)              unknown event or arm
├── Conflict (409)              a repeated key with different content, a full catalogue
├── PayloadTooLarge (413)       body over max_body_bytes
├── UnsupportedMediaType (415)  a body not sent as application/json
├── Unauthorized (401)          missing or wrong API key; carries WWW-Authenticate
├── Forbidden (403)             a valid key without the needed role
└── Unavailable (503)           a dependency (database) is down, full, read-only or timed
    │                           out; carries Retry-After and, from the database, its cause
    ├── BatcherClosed           the process is shutting down and takes no more decisions
    └── Overloaded              the replica's /select queue is full (`overloaded`): refused
                                at once, never queued

`ServiceError.response()` is the HTTP answer: `rofu.service.api.app` returns it from one exception
handler, and the authentication and body-limit middleware (which run before the app) send
it themselves.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import JSONResponse


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The one shape of every error body."""
    body = {"error": {"code": code, "message": message, "field": field}}
    return JSONResponse(body, status_code=status, headers=headers)


class ServiceError(Exception):
    """Base of every error the API reports on purpose."""

    status_code = 500
    code = "internal_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def headers(self) -> dict[str, str] | None:
        """Headers the response carries besides the body."""
        return None

    def response(self) -> JSONResponse:
        """This error as an HTTP response."""
        return error_response(self.status_code, self.code, self.message, self.field, self.headers())


class InvalidInput(ServiceError):
    """Bad input (422): what the request schema refuses, or what it accepted but the service
    cannot take."""

    status_code = 422
    code = "invalid_input"


class NotFound(ServiceError):
    """The event or arm the request names does not exist (404)."""

    status_code = 404
    code = "not_found"


class Conflict(ServiceError):
    """The request contradicts stored state (409)."""

    status_code = 409
    code = "conflict"


class PayloadTooLarge(ServiceError):
    """The body exceeds the configured limit (413)."""

    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaType(ServiceError):
    """A body whose content-type is not JSON, to an endpoint that reads JSON (415)."""

    status_code = 415
    code = "unsupported_media_type"


class Unauthorized(ServiceError):
    """No API key, or an unknown one (401)."""

    status_code = 401
    code = "unauthorized"

    def headers(self) -> dict[str, str] | None:
        """The scheme the client should authenticate with."""
        return {"WWW-Authenticate": "Bearer"}


class Forbidden(ServiceError):
    """The key is valid but lacks the role (403)."""

    status_code = 403
    code = "forbidden"


class Unavailable(ServiceError):
    """A dependency is down; the client should retry after `retry_after` seconds (503)."""

    status_code = 503
    code = "unavailable"

    def __init__(self, message: str, *, retry_after: int = 2, cause: str | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.cause = cause  # a database failure's cause (rofu.service.db.faults), for the log

    def headers(self) -> dict[str, str] | None:
        """When the client should retry."""
        return {"Retry-After": str(self.retry_after)}


class BatcherClosed(Unavailable):
    """The micro-batcher takes no more items: the process is shutting down (503)."""

    def __init__(self, message: str = "the service is shutting down") -> None:
        super().__init__(message, retry_after=1)


class Overloaded(Unavailable):
    """The replica already holds `limit` /select requests (ROFU_SELECT_QUEUE_MAX): this one
    is refused at once instead of queueing behind them (503)."""

    code = "overloaded"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the service is at capacity: {limit} requests already wait to be decided "
            "(ROFU_SELECT_QUEUE_MAX); retry after Retry-After seconds with the same event_id",
            retry_after=1,
        )
