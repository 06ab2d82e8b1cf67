"""API keys: who may call what.

Client keys may call /select, /reward and the read-only endpoints; admin keys may call
everything, including catalogue changes and /admin. /healthz, /readyz and /metrics stay
open for probes and scrapers. A request without a valid key is refused before its body is
read (`rofu.service.api.middleware.AuthenticationMiddleware`); the routes' dependencies
(`rofu.service.api.deps`) check the role. Keys arrive as `Authorization: Bearer <key>` (or
`X-API-Key: <key>`; the Personalizer-compatible facade also reads Personalizer's
`Ocp-Apim-Subscription-Key: <key>`), are kept only as SHA-256 digests and compared in
constant time, and are never logged. With no keys configured (the embedded default) every
endpoint is open and the service says so at start; production mode refuses to start
without keys.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import HTTPConnection

from rofu.service.errors import Forbidden, Unauthorized
from rofu.service.settings import Settings

log = logging.getLogger("rofu.security")
MIN_PRODUCTION_KEY_LENGTH = 16
#: Headers a key may come in besides `Authorization: Bearer`, in the order they are read.
KEY_HEADERS = ("X-API-Key",)
#: Personalizer's key header, read on the Personalizer-compatible facade's routes.
SUBSCRIPTION_KEY_HEADER = "Ocp-Apim-Subscription-Key"
#: The headers a facade route reads a key from besides `Authorization: Bearer`.
SUBSCRIBER_KEY_HEADERS = (SUBSCRIPTION_KEY_HEADER, *KEY_HEADERS)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def read_key_file(path: Path) -> list[str]:
    """Keys from a secret file: one per line; blank lines and `#` comments ignored."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read API key file {path}: {exc.strerror}") from exc
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


@dataclass(frozen=True)
class KeyRing:
    """Digests of the client and admin keys."""

    client: tuple[bytes, ...]
    admin: tuple[bytes, ...]

    @property
    def open(self) -> bool:
        """No key configured: every endpoint is open."""
        return not self.client and not self.admin

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        """Collect keys from the settings and key files; enforce production's rules."""
        client = [k.get_secret_value() for k in settings.api_keys]
        admin = [k.get_secret_value() for k in settings.admin_api_keys]
        if settings.api_keys_file is not None:
            client += read_key_file(settings.api_keys_file)
        if settings.admin_api_keys_file is not None:
            admin += read_key_file(settings.admin_api_keys_file)
        if settings.mode == "production":
            if not client or not admin:
                raise ValueError(
                    "production mode needs client and admin API keys: set ROFU_API_KEYS_FILE "
                    "and ROFU_ADMIN_API_KEYS_FILE (or ROFU_API_KEYS / ROFU_ADMIN_API_KEYS)"
                )
            if min(len(k) for k in client + admin) < MIN_PRODUCTION_KEY_LENGTH:
                raise ValueError(
                    f"production API keys must have at least {MIN_PRODUCTION_KEY_LENGTH} characters"
                )
        ring = cls(tuple(_digest(k) for k in client), tuple(_digest(k) for k in admin))
        if ring.open:
            log.warning(
                "no API keys configured: every endpoint is open to anyone who can "
                "reach this port (fine for the embedded demo, never for production)"
            )
        return ring

    def role(self, presented: str) -> str | None:
        """`admin`, `client` or None; compares against every key in constant time."""
        digest = _digest(presented)
        # sum, not any: every key is compared, so timing does not tell which matched
        is_admin = sum(hmac.compare_digest(digest, k) for k in self.admin) > 0
        is_client = sum(hmac.compare_digest(digest, k) for k in self.client) > 0
        return "admin" if is_admin else "client" if is_client else None


def presented_key(request: HTTPConnection, headers: Sequence[str] = KEY_HEADERS) -> str | None:
    """The key a request carries, if any: its bearer token, else the first of `headers`."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return next((request.headers[name] for name in headers if request.headers.get(name)), None)


def authorise(
    keys: KeyRing, request: HTTPConnection, *, admin: bool, headers: Sequence[str] = KEY_HEADERS
) -> None:
    """Raise Unauthorized (401) or Forbidden (403) unless the request may go on; the key
    is read from `Authorization: Bearer`, else from the first of `headers` present."""
    if keys.open:
        return
    key = presented_key(request, headers)
    if key is None:
        others = "".join(f" or `{name}: <key>`" for name in headers if name != "X-API-Key")
        raise Unauthorized(f"an API key is required: send `Authorization: Bearer <key>`{others}")
    role = keys.role(key)
    if role is None:
        raise Unauthorized("the API key is not valid")
    if admin and role != "admin":
        raise Forbidden("this endpoint needs an admin API key")
