"""Request bodies and URLs read strictly: every string valid Unicode before anything uses it.

JSON's `\\uXXXX` escapes can spell half of a UTF-16 surrogate pair (`"\\ud800"`): Python's
json reads it, but no UTF-8 encoder (the feature hash, the database driver, the error
response) can write it. Bytes that are not UTF-8, which RFC 8259 requires of JSON sent over
a network, are refused too (a leading byte order mark is ignored, as the RFC allows).

`JsonRoute`, the route class of every router, checks a route's URL and decodes its JSON
body once, before FastAPI reads it, and refuses invalid Unicode anywhere, keys included,
with a 422 (`InvalidInput`) naming where: the path of the string in the body
(`context.\\ud800`, `contextFeatures.0.city`; a key's invalid characters written as
escapes), `body` when the bytes are not JSON even around the bad ones, `query.<name>` or
`path` when percent-decoding the URL gives bytes that are not UTF-8 (the server would read
them as U+FFFD). A body sent as another content type is left to FastAPI, whose error is
the content type's; UTF-8 that is not JSON keeps FastAPI's own error, naming the character.
"""

from __future__ import annotations

import contextlib
import email.message
import json
import re
from collections.abc import Callable, Coroutine, Iterator
from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.types import Scope

from rofu.service.errors import InvalidInput

Loc = tuple[str | int, ...]
#: A string's place in a JSON value as a chain of (parent, key or index) links: building
#: a tuple per item would cost the nesting depth for each.
Link = tuple[Any, str | int] | None
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_ESCAPED_BYTES = range(0xDC80, 0xDD00)  # what `surrogateescape` makes of bytes 0x80-0xff
_UNSET: Any = object()


def decode_json(body: bytes) -> Any:
    """The JSON value of a body whose every string, keys included, is valid Unicode.

    Raises:
        InvalidInput: bytes that are not UTF-8, a string holding a lone surrogate, JSON
            nested too deeply or a number too long to read; the field names where.
        json.JSONDecodeError: UTF-8 that is not JSON (FastAPI's own 422 names the
            character).
    """
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _not_utf8(body, exc) from exc
    value = _loads(text)
    if _SURROGATE_ESCAPE.search(text):  # UTF-8 text holds a surrogate only from an escape
        found = _first_invalid(value)
        if found is not None:
            raise _invalid_string(*found, raw=False)
    return value


def _loads(text: str) -> Any:
    """`json.loads`, its refusals other than a syntax error as InvalidInput."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError as exc:
        raise InvalidInput("body: JSON nested too deeply", field="body") from exc
    except ValueError as exc:  # an integer of more digits than Python reads
        reason = str(exc).partition(";")[0]
        raise InvalidInput(f"body: cannot be read as JSON ({reason})", field="body") from exc


def _not_utf8(body: bytes, exc: UnicodeDecodeError) -> InvalidInput:
    """The error of a body that is not UTF-8: naming the string that holds bad bytes when
    the body is JSON around them, else the body and the first bad byte."""
    with contextlib.suppress(ValueError, RecursionError):
        found = _first_invalid(json.loads(body.decode("utf-8-sig", "surrogateescape")))
        if found is not None:
            return _invalid_string(*found, raw=True)
    message = f"body: not valid UTF-8 at byte {exc.start} ({exc.reason}); send JSON as UTF-8"
    return InvalidInput(message, field="body")


def _first_invalid(value: Any) -> tuple[Loc, str, bool] | None:
    """The path, text and key-ness of the first string of `value` with a surrogate."""
    for link, text, is_key in _strings(value):
        if _SURROGATE.search(text):
            return _unlink(link), text, is_key
    return None


def _strings(value: Any) -> Iterator[tuple[Link, str, bool]]:
    """Every string of a JSON value, keys included (True), in document order, each with
    its place; iterative, so no nesting the parser accepted is too deep for it."""
    stack: list[tuple[Link, Any]] = [(None, value)]
    while stack:
        link, item = stack.pop()
        if isinstance(item, str):
            yield link, item, False
        elif isinstance(item, dict):
            for key in item:
                yield (link, key), key, True
            stack.extend(((link, key), child) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend(((link, i), child) for i, child in reversed(list(enumerate(item))))


def _unlink(link: Link) -> Loc:
    parts: list[str | int] = []
    while link is not None:
        link, part = link
        parts.append(part)
    return tuple(reversed(parts))


def _shown(text: str, raw: bool) -> str:
    """`text` printable: a surrogate as its escape (`\\ud800`), or, in a body that is not
    UTF-8 (`raw`), a byte that `surrogateescape` kept as its byte (`\\xe9`)."""
    return _SURROGATE.sub(lambda m: _escape(m.group(), raw), text)


def _escape(char: str, raw: bool) -> str:
    code = ord(char)
    return f"\\x{code - 0xDC00:02x}" if raw and code in _ESCAPED_BYTES else f"\\u{code:04x}"


def _invalid_string(loc: Loc, text: str, is_key: bool, *, raw: bool) -> InvalidInput:
    """The 422 of a string of the body that is not valid Unicode, naming its path."""
    field = ".".join(_shown(part, raw) if isinstance(part, str) else str(part) for part in loc)
    field = field or "body"
    char = _SURROGATE.search(text)
    assert char is not None  # the string was found for it
    what = "the key" if is_key else "the string"
    if raw and ord(char.group()) in _ESCAPED_BYTES:
        byte = _escape(char.group(), raw)
        reason = f"{what} holds a byte that is not UTF-8 ({byte}); send JSON as UTF-8"
    else:
        reason = (
            f"{what} holds a lone surrogate ({_escape(char.group(), False)}), half of a "
            "UTF-16 pair, which is not valid Unicode"
        )
    return InvalidInput(f"{field}: {reason}", field=field)


def check_url(scope: Scope) -> None:
    """Refuse a path or query parameter whose percent-decoded bytes are not UTF-8.

    Raises:
        InvalidInput: naming `path` or `query.<name>`.
    """
    raw_path = scope.get("raw_path")
    if raw_path is not None and not _is_utf8(unquote_to_bytes(raw_path)):
        raise InvalidInput("path: not valid UTF-8 once percent-decoded", field="path")
    for pair in scope.get("query_string", b"").split(b"&"):
        name, _, value = pair.partition(b"=")
        if not (_is_utf8(_unquote(name)) and _is_utf8(_unquote(value))):
            field = f"query.{_unquote(name).decode('utf-8', 'backslashreplace')}"
            message = f"{field}: not valid UTF-8 once percent-decoded"
            raise InvalidInput(message, field=field)


def _unquote(part: bytes) -> bytes:
    """A query string's name or value percent-decoded (`+` is a space), as bytes."""
    return unquote_to_bytes(part.replace(b"+", b" "))


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def is_json(content_type: str) -> bool:
    """Whether FastAPI reads a body of this content-type as JSON (`application/json` or
    `application/...+json`), parsed the way it does."""
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


class DecodedRequest(Request):
    """A request whose `json()` is `decode_json` of its body, decoded once."""

    _decoded: Any = _UNSET

    async def json(self) -> Any:
        """The body's JSON value (see `decode_json`)."""
        if self._decoded is _UNSET:
            self._decoded = decode_json(await self.body())
        return self._decoded

    async def decode(self) -> None:
        """Decode the body now: invalid Unicode is refused before anything reads it; JSON
        that does not parse is left to FastAPI, whose error names the character."""
        with contextlib.suppress(json.JSONDecodeError):
            await self.json()


class JsonRoute(APIRoute):
    """A route whose URL, and JSON body if it takes one, are checked before FastAPI reads
    them (the route class of every router)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, behind the checks."""
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def strict(request: Request) -> Response:
            check_url(request.scope)
            if not takes_body:
                return await handler(request)
            decoded = DecodedRequest(request.scope, request.receive)
            if is_json(decoded.headers.get("content-type", "")):
                await decoded.decode()
            return await handler(decoded)

        return strict
