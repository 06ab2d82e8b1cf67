"""The client's one error: what the service refused, or a request that failed every retry."""

from __future__ import annotations

import httpx


class RofuError(Exception):
    """A request the service refused, or that failed after every retry.

    Attributes:
        status: the HTTP status (0: the service could not be reached).
        code: the service's error code (`invalid_input`, `unavailable`, ...).
        message: the service's message.
        field: the request field the error names, if any (`context.user.age`).
    """

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field

    @classmethod
    def from_response(cls, response: httpx.Response) -> RofuError:
        """The error the service's `{"error": {...}}` body describes."""
        try:
            error = response.json()["error"]
            return cls(response.status_code, error["code"], error["message"], error.get("field"))
        except (ValueError, KeyError, TypeError):
            return cls(response.status_code, "http_error", response.text[:200] or "no body")
