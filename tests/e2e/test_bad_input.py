"""Bad input against a real service process: a clear 4xx JSON error, and nothing written.

One `rofu serve` process (uvicorn, SQLite file) serves the whole module; a real httpx
client sends every request as raw bytes, so NaN, Infinity and malformed JSON reach the
server exactly as a careless client would send them. Rows are counted in the SQLite file
itself before and after each request.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import service_process

TABLES = ("decisions", "rewards", "arms", "checkpoints")
GOOD_CONTEXT = [0.1, 0.2, 0.3, 0.4]
KNOWN_EVENT = "known-1"


@dataclass(frozen=True)
class Server:
    """The running service, a client for it and its database file."""

    client: httpx.Client
    database: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("bad-input")
    database = root / "db.sqlite"
    env = {
        "ROFU_DATABASE_URL": f"sqlite:///{database}",
        "ROFU_CONTEXT_DIM": "4",
        "ROFU_EMBEDDED_TRAINER": "false",
    }
    with (
        service_process(env, root / "log") as base_url,
        httpx.Client(base_url=base_url, timeout=30) as client,
    ):
        known = client.post("/v1/select", json={"context": GOOD_CONTEXT, "event_id": KNOWN_EVENT})
        assert known.status_code == 200, known.text
        yield Server(client, database)


def _counts(database: Path) -> dict[str, int]:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        return {
            table: connection.execute(f"select count(*) from {table}").fetchone()[0]
            for table in TABLES
        }


def _body(value: object) -> bytes:
    return json.dumps(value).encode()


def _select(**fields: object) -> bytes:
    return _body({"context": GOOD_CONTEXT, **fields})


@dataclass(frozen=True)
class Case:
    """A bad request and the error it must get."""

    name: str
    method: str
    path: str
    body: bytes
    status: int
    field: str | None

    def __str__(self) -> str:
        return self.name


CASES = [
    # Bodies that are not a JSON object.
    Case("select-empty-body", "POST", "/v1/select", b"", 422, "body"),
    Case("select-not-json", "POST", "/v1/select", b"context=1,2,3,4", 422, "body"),
    Case("select-truncated-json", "POST", "/v1/select", b'{"context": [1, 2', 422, "body"),
    Case("select-trailing-garbage", "POST", "/v1/select", _select() + b" x", 422, "body"),
    Case("select-json-array", "POST", "/v1/select", b"[[0.1, 0.2, 0.3, 0.4]]", 422, "body"),
    Case("select-json-string", "POST", "/v1/select", b'"hello"', 422, "body"),
    Case("select-json-null", "POST", "/v1/select", b"null", 422, "body"),
    Case("reward-empty-body", "POST", "/v1/reward", b"", 422, "body"),
    Case("reward-not-json", "POST", "/v1/reward", b"event_id=known-1", 422, "body"),
    Case("arms-json-array", "POST", "/v1/arms", b'["arm-9"]', 422, "body"),
    # Wrong types (the schema is strict: no coercion of strings or booleans).
    Case("context-missing", "POST", "/v1/select", b"{}", 422, "context"),
    Case("context-string", "POST", "/v1/select", _body({"context": "0.1,0.2"}), 422, "context"),
    Case("context-null", "POST", "/v1/select", _body({"context": None}), 422, "context"),
    Case(
        "context-nested-object",
        "POST",
        "/v1/select",
        _body({"context": {"a": {"b": {"c": 1}}}}),
        422,
        "context.a.b",
    ),
    Case(
        "context-named-mixed-list",
        "POST",
        "/v1/select",
        _body({"context": {"user": {"tags": ["a", 2]}}}),
        422,
        "context.user.tags.1",
    ),
    Case(
        "arm-features-per-arm-model",
        "POST",
        "/v1/select",
        _select(arm_features={"arm-0": [1.0]}),
        422,
        "arm_features",
    ),
    Case(
        "context-item-strings",
        "POST",
        "/v1/select",
        _body({"context": ["0.1", "0.2", "0.3", "0.4"]}),
        422,
        "context.0",
    ),
    Case(
        "context-item-bool",
        "POST",
        "/v1/select",
        _body({"context": [0.1, True, 0.3, 0.4]}),
        422,
        "context.1",
    ),
    Case(
        "context-item-list",
        "POST",
        "/v1/select",
        _body({"context": [0.1, 0.2, [0.3], 0.4]}),
        422,
        "context.2",
    ),
    Case("explore-string", "POST", "/v1/select", _select(explore="false"), 422, "explore"),
    Case("explore-number", "POST", "/v1/select", _select(explore=0), 422, "explore"),
    Case("event-id-number", "POST", "/v1/select", _select(event_id=17), 422, "event_id"),
    Case("arms-string", "POST", "/v1/select", _select(arms="arm-0"), 422, "arms"),
    Case("exclude-number", "POST", "/v1/select", _select(exclude=[3]), 422, "exclude.0"),
    Case(
        "value-string",
        "POST",
        "/v1/reward",
        _body({"event_id": KNOWN_EVENT, "value": "1"}),
        422,
        "value",
    ),
    Case(
        "value-bool",
        "POST",
        "/v1/reward",
        _body({"event_id": KNOWN_EVENT, "value": True}),
        422,
        "value",
    ),
    Case(
        "value-null",
        "POST",
        "/v1/reward",
        _body({"event_id": KNOWN_EVENT, "value": None}),
        422,
        "value",
    ),
    Case("value-missing", "POST", "/v1/reward", _body({"event_id": KNOWN_EVENT}), 422, "value"),
    Case("reward-event-missing", "POST", "/v1/reward", _body({"value": 1.0}), 422, "event_id"),
    # Non-finite numbers, sent as the literals Python's json module would write.
    Case("context-nan", "POST", "/v1/select", b'{"context":[1,NaN,0,0]}', 422, "context.1"),
    Case(
        "context-infinity", "POST", "/v1/select", b'{"context":[1,0,Infinity,0]}', 422, "context.2"
    ),
    Case(
        "context-minus-inf",
        "POST",
        "/v1/select",
        b'{"context":[-Infinity,0,0,0]}',
        422,
        "context.0",
    ),
    Case("context-overflow", "POST", "/v1/select", b'{"context":[1e999,0,0,0]}', 422, "context.0"),
    Case("value-nan", "POST", "/v1/reward", b'{"event_id":"known-1","value":NaN}', 422, "value"),
    Case(
        "value-infinity",
        "POST",
        "/v1/reward",
        b'{"event_id":"known-1","value":Infinity}',
        422,
        "value",
    ),
    Case(
        "value-minus-inf",
        "POST",
        "/v1/reward",
        b'{"event_id":"known-1","value":-Infinity}',
        422,
        "value",
    ),
    Case(
        "value-overflow",
        "POST",
        "/v1/reward",
        b'{"event_id":"known-1","value":-1e400}',
        422,
        "value",
    ),
    # Values the schema cannot see.
    Case(
        "context-short", "POST", "/v1/select", _body({"context": [0.1, 0.2, 0.3]}), 422, "context"
    ),
    Case("context-long", "POST", "/v1/select", _body({"context": [0.1] * 5}), 422, "context"),
    Case("context-empty", "POST", "/v1/select", _body({"context": []}), 422, "context"),
    Case("arms-unknown", "POST", "/v1/select", _select(arms=["arm-0", "arm-99"]), 422, "arms.1"),
    Case("exclude-unknown", "POST", "/v1/select", _select(exclude=["arm-99"]), 422, "exclude.0"),
    Case("arms-duplicate", "POST", "/v1/select", _select(arms=["arm-1", "arm-1"]), 422, "arms.1"),
    Case(
        "exclude-duplicate",
        "POST",
        "/v1/select",
        _select(exclude=["arm-1", "arm-1"]),
        422,
        "exclude.1",
    ),
    Case(
        "exclude-everything",
        "POST",
        "/v1/select",
        _select(exclude=["arm-0", "arm-1", "arm-2", "arm-3"]),
        422,
        "exclude",
    ),
    Case(
        "arms-all-excluded",
        "POST",
        "/v1/select",
        _select(arms=["arm-2"], exclude=["arm-2"]),
        422,
        "exclude",
    ),
    Case("arms-empty", "POST", "/v1/select", _select(arms=[]), 422, "arms"),
    Case("arms-bad-id", "POST", "/v1/select", _select(arms=["arm 0"]), 422, "arms.0"),
    # Unknown fields are refused, never ignored.
    Case("select-extra-field", "POST", "/v1/select", _select(colour="red"), 422, "colour"),
    Case("select-misspelt-field", "POST", "/v1/select", _select(exlude=["arm-0"]), 422, "exlude"),
    Case(
        "reward-extra-field",
        "POST",
        "/v1/reward",
        _body({"event_id": KNOWN_EVENT, "value": 1.0, "weight": 2}),
        422,
        "weight",
    ),
    Case("arm-extra-field", "POST", "/v1/arms", _body({"id": "arm-9", "colour": 1}), 422, "colour"),
    # Event ids.
    Case("event-id-space", "POST", "/v1/select", _select(event_id="order 1"), 422, "event_id"),
    Case("event-id-slash", "POST", "/v1/select", _select(event_id="a/b"), 422, "event_id"),
    Case("event-id-unicode", "POST", "/v1/select", _select(event_id="ordér-1"), 422, "event_id"),
    Case("event-id-empty", "POST", "/v1/select", _select(event_id=""), 422, "event_id"),
    Case("event-id-leading-dash", "POST", "/v1/select", _select(event_id="-x"), 422, "event_id"),
    Case("event-id-129-chars", "POST", "/v1/select", _select(event_id="e" * 129), 422, "event_id"),
    Case("event-id-newline", "POST", "/v1/select", _select(event_id="order-1\n"), 422, "event_id"),
    Case(
        "reward-event-id-bad",
        "POST",
        "/v1/reward",
        _body({"event_id": "known 1", "value": 1.0}),
        422,
        "event_id",
    ),
    Case(
        "reward-event-id-129-chars",
        "POST",
        "/v1/reward",
        _body({"event_id": "e" * 129, "value": 1.0}),
        422,
        "event_id",
    ),
    Case(
        "reward-unknown-event",
        "POST",
        "/v1/reward",
        _body({"event_id": "never-selected", "value": 1.0}),
        404,
        "event_id",
    ),
    # The arm catalogue.
    Case("arm-bad-id", "POST", "/v1/arms", _body({"id": "arm 9"}), 422, "id"),
    Case("arm-empty-id", "POST", "/v1/arms", _body({"id": ""}), 422, "id"),
    Case("arm-id-129-chars", "POST", "/v1/arms", _body({"id": "a" * 129}), 422, "id"),
    Case("arm-id-number", "POST", "/v1/arms", _body({"id": 9}), 422, "id"),
    Case("arm-id-newline", "POST", "/v1/arms", _body({"id": "arm-9\n"}), 422, "id"),
    Case("arm-missing-id", "POST", "/v1/arms", b"{}", 422, "id"),
    Case(
        "arm-features-per-arm-model",
        "POST",
        "/v1/arms",
        _body({"id": "arm-9", "features": [0.5, 1.0]}),
        422,
        "features",
    ),
    Case(
        "arm-features-nan",
        "POST",
        "/v1/arms",
        b'{"id":"arm-9","features":[NaN]}',
        422,
        "features.0",
    ),
    Case("arm-delete-bad-id", "DELETE", "/v1/arms/arm%209", b"", 422, "path.arm_id"),
    # Invalid Unicode: a lone surrogate (a valid JSON escape), bytes that are not UTF-8.
    Case(
        "named-key-surrogate",
        "POST",
        "/v1/select",
        b'{"context": {"user": {"\\ud800": 1}}}',
        422,
        "context.user.\\ud800",
    ),
    Case(
        "named-value-surrogate",
        "POST",
        "/v1/select",
        b'{"context": {"city": "Par\\udfffis"}}',
        422,
        "context.city",
    ),
    Case("event-id-surrogate", "POST", "/v1/reward", b'{"event_id": "\\udc00"}', 422, "event_id"),
    Case("arm-id-surrogate", "POST", "/v1/arms", b'{"id": "arm-\\ud800"}', 422, "id"),
    Case(
        "named-key-latin-1",
        "POST",
        "/v1/select",
        b'{"context": {"caf\xe9": 1}}',
        422,
        "context.caf\\xe9",
    ),
    Case("body-latin-1", "POST", "/v1/select", b"\xe9t\xe9", 422, "body"),
    Case("activate-path-not-utf8", "POST", "/v1/events/%ff/activate", b"", 422, "path"),
]


def _send(server: Server, case: Case) -> httpx.Response:
    headers = {"content-type": "application/json"} if case.method == "POST" else {}
    return server.client.request(case.method, case.path, content=case.body, headers=headers)


def _assert_no_traceback(response: httpx.Response) -> None:
    assert "Traceback" not in response.text
    assert 'File "' not in response.text


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_gets_a_clear_error_and_writes_nothing(server: Server, case: Case) -> None:
    before = _counts(server.database)
    response = _send(server, case)
    assert response.status_code == case.status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"code", "message", "field"}
    assert error["field"] == case.field
    assert case.field is not None
    assert case.field.rsplit(".", 1)[-1] in error["message"]  # names the field
    assert error["code"] == ("not_found" if case.status == 404 else "invalid_input")
    _assert_no_traceback(response)
    assert _counts(server.database) == before


@pytest.mark.parametrize("path", ["/v1/select", "/v1/reward", "/v1/arms"])
def test_bad_input_huge_body_is_413(server: Server, path: str) -> None:
    before = _counts(server.database)
    padding = "x" * (300 * 1024)  # max_body_bytes defaults to 256 KiB
    body = _body({"context": GOOD_CONTEXT, "event_id": "huge-1", "padding": padding})
    response = server.client.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "payload_too_large"
    assert "262144 bytes" in error["message"]
    _assert_no_traceback(response)
    assert _counts(server.database) == before


def test_bad_input_huge_chunked_body_is_413(server: Server) -> None:
    """Without a Content-Length the limit is enforced while the body streams in."""
    before = _counts(server.database)

    def chunks() -> Iterator[bytes]:
        yield b'{"context": [0.1, 0.2, 0.3, 0.4], "padding": "'
        for _ in range(40):
            yield b"x" * 8192
        yield b'"}'

    response = server.client.post(
        "/v1/select", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "payload_too_large"
    assert _counts(server.database) == before


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 50_000 + b"]" * 50_000,  # nesting deeper than any JSON parser recursion
        b'{"context": [0.1, 0.2, 0.3, 0.4], "event_id": "\xff\xfe"}',  # not UTF-8
        b'{"context": {"\\ud800": 1}}',  # a lone surrogate (failed hashing it: a 500)
        b"\x00\x01\x02",
    ],
    ids=["deep-nesting", "invalid-utf8", "lone-surrogate", "binary"],
)
def test_bad_input_unparseable_body_is_a_4xx_without_traceback(server: Server, body: bytes) -> None:
    before = _counts(server.database)
    response = server.client.post(
        "/v1/select", content=body, headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500, response.text
    assert set(response.json()["error"]) == {"code", "message", "field"}
    _assert_no_traceback(response)
    assert _counts(server.database) == before


def test_bad_input_leaves_the_service_working(server: Server) -> None:
    """After every refusal above the same process still decides and stores rewards."""
    before = _counts(server.database)
    decision = server.client.post("/v1/select", json={"context": GOOD_CONTEXT})
    assert decision.status_code == 200, decision.text
    event_id = decision.json()["event_id"]
    reward = server.client.post("/v1/reward", json={"event_id": event_id, "value": 1.0})
    assert reward.status_code == 200, reward.text
    after = _counts(server.database)
    assert after["decisions"] == before["decisions"] + 1
    assert after["rewards"] == before["rewards"] + 1
