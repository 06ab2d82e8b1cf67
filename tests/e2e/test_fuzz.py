"""Schemathesis against a real service process: no 5xx, the schema holds, refusals write nothing.

One `rofu serve` process (SQLite file, a seeded checkpoint, client and admin API keys)
serves the module. Schemathesis's engine (the one behind `st run`: examples, coverage,
fuzzing and stateful phases, one request at a time) reads its served `/openapi.json`
and sends what it generates, three times: without a key (everything but the probes must
be refused), with the client key (admin operations must be 403) and with the admin key
(every operation can succeed). Two aids, so that generated requests reach the service's
logic rather than only its validation: the context length (configuration, which the
schema states in words) is filled into the schema, and every other /select event_id
gets a fresh suffix (Hypothesis reuses a few keys, and a reused key is a correct 409).

Every response goes through schemathesis's checks (no server error, documented status
codes, content types and headers, response bodies matching their schema, schema-invalid
requests refused, 405s naming the allowed methods), except `positive_data_acceptance`: a
schema-valid request may rightly be refused by rules the schema cannot carry (arm ids
must exist in the catalogue, a candidate set must not be empty, arm features must match
arm_feature_dim).

State: after every response the SQLite file is read back and the change since the
previous response must be exactly what that response accounts for: a 2xx /select adds
its decision (none for a replayed event_id), a 2xx /reward with duplicate=false adds its
reward, a 201 POST /v1/arms adds its arm, a 2xx DELETE /v1/arms retires it, a 2xx on
/admin/pin sets the pin it reports; anything else (every 4xx) changes nothing.

The service log must hold no traceback. `test_fuzz_findings_stay_fixed` replays what
fuzzing found (500s and contract mismatches) exactly. `test_fuzz_invalid_unicode_anywhere`
does what the generators do not (they draw valid Unicode only): it spoils every string of a
valid body of every JSON operation, keys and values, with a lone surrogate or with bytes
that are not UTF-8, at a random place; each must be a 422 (the facade's 400) naming that
string, and change nothing.

Size: ROFU_FUZZ_EXAMPLES (default 100: about 1,200 cases and 15 s) examples per
operation and phase for the admin run, a fifth of it (at least 10) for the others;
ROFU_FUZZ_SECONDS (default 120) bounds each run's time (the engine is stopped after the
scenario in progress). ROFU_FUZZ_SEED replays a run; by default every run draws a new
seed, printed with the summary (`pytest -s`) and in any failure.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.engine import events, from_schema

from rofu.client.schemas import EVENT_ID_PATTERN
from rofu.service.settings import Settings
from tests.support import seed_checkpoint, service_process

FUZZ_EXAMPLES = int(os.environ.get("ROFU_FUZZ_EXAMPLES", "100"))
FUZZ_SECONDS = float(os.environ.get("ROFU_FUZZ_SECONDS", "120"))
FUZZ_SEED = os.environ.get("ROFU_FUZZ_SEED")
CONTEXT_DIM = 8  # the demo's: the schema's example context has 8 values
CLIENT_KEY = "fuzz-client-key-0123456789"
ADMIN_KEY = "fuzz-admin-key-0123456789"
KNOWN_EVENT = "order-1234"  # the schema's example event_id, so /reward examples find it
ADMIN_PATHS = ("/v1/arms", "/v1/admin/", "/v1/decisions")
OPEN_PATHS = ("/healthz", "/readyz", "/metrics")
RANK = "POST /personalizer/v1.0/rank"
REWARD = "POST /personalizer/v1.0/events/{eventId}/reward"
WRITES = frozenset(
    {"POST /v1/select", "POST /v1/reward", "POST /v1/arms", "DELETE /v1/arms/{arm_id}"}
    | {"PUT /v1/admin/pin", "DELETE /v1/admin/pin", RANK, REWARD}
)


@dataclass(frozen=True)
class Server:
    """The running service and its database file."""

    base_url: str
    database: Path
    log: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("fuzz")
    database = root / "rofu.sqlite"
    settings = Settings(
        database_url=f"sqlite:///{database}", context_dim=CONTEXT_DIM, hidden=(16, 16)
    )
    seed_checkpoint(settings, n_rows=200)
    env = {
        "ROFU_DATABASE_URL": settings.database_url,
        "ROFU_CONTEXT_DIM": str(CONTEXT_DIM),
        "ROFU_HIDDEN": "[16, 16]",
        "ROFU_EMBEDDED_TRAINER": "false",
        "ROFU_API_KEYS": json.dumps([CLIENT_KEY]),
        "ROFU_ADMIN_API_KEYS": json.dumps([ADMIN_KEY]),
    }
    log = root / "service.log"
    with service_process(env, log) as base_url:
        headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
        context = [0.1] * CONTEXT_DIM
        for event_id in (KNOWN_EVENT, "order-1235"):
            body = {"context": context, "event_id": event_id}
            assert (
                httpx.post(f"{base_url}/v1/select", json=body, headers=headers).status_code == 200
            )
        reward = {"event_id": "order-1235", "value": 1.0}
        assert httpx.post(f"{base_url}/v1/reward", json=reward, headers=headers).status_code == 200
        yield Server(base_url, database, log)


# The database, read back after every response -----------------------------------------


@dataclass(frozen=True)
class State:
    """What requests can change."""

    decisions: frozenset[str]
    rewards: dict[str, float]
    arms: dict[str, bool]  # id -> active
    pin: int | None
    checkpoints: frozenset[int]

    @classmethod
    def read(cls, database: Path) -> State:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            pins = db.execute("select version from model_pin").fetchall()
            return cls(
                decisions=frozenset(r[0] for r in db.execute("select event_id from decisions")),
                rewards=dict(db.execute("select event_id, value from rewards").fetchall()),
                arms={a: bool(active) for a, active in db.execute("select id, active from arms")},
                pin=pins[0][0] if pins else None,
                checkpoints=frozenset(r[0] for r in db.execute("select version from checkpoints")),
            )

    def changes_since(self, before: State) -> dict[str, Any]:
        """Every difference, by kind; empty when nothing changed."""
        changed = {
            "decisions added": sorted(self.decisions - before.decisions),
            "decisions removed": sorted(before.decisions - self.decisions),
            "rewards set": {
                k: v for k, v in self.rewards.items() if before.rewards.get(k, None) != v
            },
            "rewards removed": sorted(set(before.rewards) - set(self.rewards)),
            "arms added": sorted(set(self.arms) - set(before.arms)),
            "arms retired": sorted(
                a for a, active in self.arms.items() if not active and before.arms.get(a, False)
            ),
            "arms reactivated or removed": sorted(
                a for a, active in before.arms.items() if not active and self.arms.get(a, True)
            ),
            "checkpoints": sorted(self.checkpoints ^ before.checkpoints),
        }
        result: dict[str, Any] = {k: v for k, v in changed.items() if v}
        if self.pin != before.pin:
            result["pin"] = self.pin
        return result


def explained(
    operation: str, status: int, response: Any, before: State, case: Any
) -> dict[str, Any]:
    """The change a response accounts for (nothing unless it is a 2xx)."""
    if not 200 <= status < 300 or operation not in WRITES:
        return {}
    if operation == REWARD:  # 204, no body: the request says what was stored
        event_id, value = case.path_parameters["eventId"], case.body["value"]
        # the first value wins: a repeat, with any value, changes no stored value
        return {} if event_id in before.rewards else {"rewards set": {event_id: value}}
    body = response.json()
    if operation == RANK:
        new = body["eventId"] not in before.decisions
        return {"decisions added": [body["eventId"]]} if new else {}
    if operation == "POST /v1/select":
        new = body["event_id"] not in before.decisions
        return {"decisions added": [body["event_id"]]} if new else {}
    if operation == "POST /v1/reward":
        return {} if body["duplicate"] else {"rewards set": {body["event_id"]: body["value"]}}
    if operation == "POST /v1/arms":
        return {"arms added": [body["id"]]}
    if operation == "DELETE /v1/arms/{arm_id}":
        return {"arms retired": [body["id"]]} if before.arms.get(body["id"]) else {}
    return {"pin": body["pinned"]} if body["pinned"] != before.pin else {}


# One schemathesis run ---------------------------------------------------------------------


@dataclass
class Run:
    """What one run sent, got and found."""

    identity: str
    seed: int
    examples: int
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    unexplained: list[str] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    cases: int = 0
    phases: Counter[str] = field(default_factory=Counter)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    operations: int = 0
    stop_reason: str = ""
    out_of_time: bool = False
    seconds: float = 0.0

    @property
    def requests(self) -> int:
        return sum(sum(c.values()) for c in self.statuses.values())

    def total(self) -> Counter[int]:
        return sum(self.statuses.values(), Counter())

    def summary(self) -> str:
        lines = [
            f"fuzz [{self.identity}] seed={self.seed} max-examples={self.examples}: "
            f"{self.operations} operations, {self.cases} cases generated, "
            f"{self.requests} requests in {self.seconds:.1f}s ({self.stop_reason}"
            + (f": the {FUZZ_SECONDS:.0f}s budget ran out" if self.out_of_time else "")
            + ")",
            f"  cases by phase: {dict(self.phases)}; phases done at (s): "
            + ", ".join(f"{k} {v:.1f}" for k, v in self.phase_seconds.items()),
            f"  responses by status: {dict(sorted(self.total().items()))}",
        ]
        other: Counter[int] = Counter()
        for operation, counts in sorted(self.statuses.items()):
            if set(counts) == {405}:  # a method the path does not serve
                other += counts
            else:
                lines.append(f"  {operation}: {dict(sorted(counts.items()))}")
        if other:
            lines.append(f"  undocumented methods: {dict(other)} over {sum(other.values())} tries")
        lines.append(
            f"  check failures: {len(self.failures)}, state changes not explained by a 2xx: "
            f"{len(self.unexplained)}, errors: {len(self.errors)}"
        )
        return "\n".join(lines)


def _raw_schema(base_url: str) -> dict[str, Any]:
    """The served schema, with the configured context length filled in.

    The one constraint the schema states only in words ("its length is the configured
    context_dim"): without it almost every generated /select is a 422 and the fuzzer
    never reaches scoring. Negative cases still send every other length.
    """
    raw: dict[str, Any] = httpx.get(f"{base_url}/openapi.json").json()
    context = raw["components"]["schemas"]["SelectRequest"]["properties"]["context"]
    context.update(minItems=CONTEXT_DIM, maxItems=CONTEXT_DIM)
    return raw


def fuzz(server: Server, identity: str, key: str | None, examples: int) -> Run:
    """One schemathesis run (all phases, one worker) with `key`; every response checked."""
    seed = int(FUZZ_SEED) if FUZZ_SEED else random.randrange(2**32)
    config = schemathesis.Config.from_dict(
        {
            "seed": seed,
            "base-url": server.base_url,
            "headers": {} if key is None else {"Authorization": f"Bearer {key}"},
            "workers": 1,  # one request at a time: each state change has one response
            "request-timeout": 30,
            "continue-on-failure": True,
            "cache": {"enabled": False},
            "generation": {"max-examples": examples, "database": "none"},
            "checks": {"positive_data_acceptance": {"enabled": False}},
        }
    )
    schema = schemathesis.openapi.from_dict(_raw_schema(server.base_url), config=config)
    run = Run(identity, seed, examples)
    before = State.read(server.database)

    @schema.hook("after_call")  # type: ignore[misc]
    def after_call(context: Any, case: Any, response: Any) -> None:
        nonlocal before
        operation = f"{case.method.upper()} {case.operation.path}"
        status = response.status_code
        run.statuses[operation][status] += 1
        after = State.read(server.database)
        try:
            expected = explained(operation, status, response, before, case)
        except Exception as exc:  # a 2xx body the ledger cannot read is a finding too
            expected = {"unreadable 2xx body": repr(exc)}
        actual = after.changes_since(before)
        if actual != expected:
            run.unexplained.append(
                f"{operation} -> {status}: changed {actual}, expected {expected}\n"
                f"    {case.as_curl_command()}"
            )
        before = after

    fresh = itertools.count()

    @schema.hook("map_body")  # type: ignore[misc]
    def map_body(context: Any, body: Any) -> Any:
        """Give every other valid /select event_id a fresh suffix.

        Hypothesis draws event ids from a small pool, so most generated /select requests
        reuse a key for a different request: a correct 409, but one that never reaches
        scoring. The other half keep their key, so conflicts and replays stay covered."""
        if context.operation.label != "POST /v1/select" or not isinstance(body, dict):
            return body
        event_id = body.get("event_id")
        if isinstance(event_id, str) and re.fullmatch(EVENT_ID_PATTERN, event_id):
            n = next(fresh)
            if n % 2:
                return {**body, "event_id": f"{event_id[:100]}.fuzz{n}"}
        return body

    started = time.monotonic()
    stream = from_schema(schema).execute()
    for event in stream:
        if time.monotonic() - started > FUZZ_SECONDS and not run.out_of_time:
            run.out_of_time = True
            stream.stop()  # the engine finishes the scenario in progress, then stops
        if isinstance(event, events.ScenarioFinished) and event.is_test_scenario:
            run.cases += len(event.recorder.cases)
            run.phases[event.phase.value] += len(event.recorder.cases)
            for case_id, checks in event.recorder.checks.items():
                for check in checks:
                    if check.failure_info is not None:
                        failure = check.failure_info.failure
                        title = f"{failure.code} {failure.operation}: {failure.title}"
                        run.failures.setdefault(
                            title,
                            f"{failure.message}\n    {check.failure_info.code_sample}"
                            f" (case {case_id})",
                        )
        elif isinstance(event, events.NonFatalError):
            run.errors.append(f"{event.label}: {event.value!r}")
        elif isinstance(event, events.FatalError):
            run.errors.append(repr(event.exception))
        elif isinstance(event, events.PhaseFinished):
            run.phase_seconds[event.phase.name.value] = time.monotonic() - started
        elif isinstance(event, events.EngineFinished):
            run.stop_reason = str(event.stop_reason)
            for failure in event.failures:
                run.failures.setdefault(f"{failure.code} {failure.operation}", failure.message)
    run.seconds = time.monotonic() - started
    run.operations = len({op for op, counts in run.statuses.items() if set(counts) != {405}})
    print("\n" + run.summary())
    return run


def _assert_clean(run: Run, server: Server) -> None:
    server_errors = {op: c for op, c in run.statuses.items() if any(s >= 500 for s in c)}
    details = "\n".join(
        [f"seed {run.seed} (ROFU_FUZZ_SEED={run.seed} replays it)"]
        + [f"{title}: {text}" for title, text in run.failures.items()]
        + run.unexplained[:20]
        + run.errors
    )
    assert not server_errors, details
    assert not run.failures, details
    assert not run.unexplained, details
    assert not run.errors, details
    assert run.stop_reason == "completed" or run.out_of_time, details
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-5000:]


# The tests (in this order: the admin run retires arms and fills the catalogue) ------------


def test_fuzz_findings_stay_fixed(server: Server) -> None:
    """What fuzzing found, replayed exactly: each was a 500 or a contract mismatch."""
    before = State.read(server.database)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    json_type = {"content-type": "application/json"}
    with httpx.Client(base_url=server.base_url, headers=admin, timeout=30) as client:
        # Finite but huge features overflowed the network's float32 scores: choosing among
        # NaNs picked a non-candidate slot (KeyError, 500). Now the feature bound refuses
        # them first (422 naming the feature); tests/unit/test_input_bounds.py covers the
        # scorer's own guard for a raised bound.
        huge = client.post("/v1/select", json={"context": [1e30] * CONTEXT_DIM})
        assert huge.status_code == 422, huge.text
        assert huge.json()["error"]["field"] == "context.0"
        assert "ROFU_MAX_ABS_FEATURE" in huge.json()["error"]["message"]
        # A feature beyond float32's range became infinite and failed the whole micro-batch
        # (500 for every request scored with it). Now refused by the schema.
        context = [0.0] * CONTEXT_DIM
        context[1] = -1.7976931348623155e308
        beyond = client.post("/v1/select", json={"context": context})
        assert beyond.status_code == 422, beyond.text
        assert beyond.json()["error"]["field"] == "context.1"
        # A version beyond the 32-bit column overflowed in the driver (500).
        pin = client.put("/v1/admin/pin", json={"version": 68315177396257176969805824})
        assert pin.status_code == 422, pin.text
        assert pin.json()["error"]["field"] == "version"
        # A 405 named only the first route's methods (GET) for /arms and /admin/pin.
        assert client.options("/v1/arms").headers["allow"] == "GET, POST"
        assert client.request("PATCH", "/v1/admin/pin").headers["allow"] == "DELETE, GET, PUT"
        # A body that is not UTF-8 (Latin-1 "été") was a 400 of the framework's; now a 422
        # naming it, as the rest of the body's faults.
        for path in ("/v1/select", "/v1/select/validate", "/v1/reward", "/v1/arms"):
            response = client.post(path, content=b"\xe9t\xe9", headers=json_type)
            assert response.status_code == 422, response.text
            assert response.json()["error"]["field"] == "body"
        response = client.put("/v1/admin/pin", content=b"\xe9t\xe9", headers=json_type)
        assert response.status_code == 422, response.text
        # A lone surrogate ("\ud800", a valid JSON escape) as a named feature failed hashing
        # it (500). Now a 422 naming it (test_fuzz_invalid_unicode_anywhere covers the rest).
        body = b'{"context": {"\\ud800": 1}}'
        surrogate = client.post("/v1/select", content=body, headers=json_type)
        assert surrogate.status_code == 422, surrogate.text
        assert surrogate.json()["error"]["field"] == "context.\\ud800"
    paths = httpx.get(f"{server.base_url}/openapi.json").json()["paths"]
    for path, method, codes in [
        ("/v1/select", "post", {"401", "413", "422"}),
        ("/v1/select/validate", "post", {"401", "413", "422"}),
        ("/v1/reward", "post", {"401", "404", "409", "422"}),
        ("/v1/arms", "get", {"401"}),
        ("/v1/arms", "post", {"401", "403", "409", "422"}),
        ("/v1/model", "get", {"401"}),
        ("/v1/model/checkpoints", "get", {"401"}),
        ("/v1/decisions", "get", {"401", "403", "422"}),
        ("/v1/admin/pin", "get", {"401", "403"}),
        ("/v1/admin/pin", "put", {"401", "403", "404", "422"}),
        ("/v1/admin/pin", "delete", {"401", "403"}),
    ]:
        assert codes <= set(paths[path][method]["responses"]), (path, method)
    assert State.read(server.database) == before


# Invalid Unicode in every string of every JSON body ----------------------------------------

#: A valid body for every operation of the schema that takes JSON, with a string wherever the
#: schema has one (keys included); the facade's reward path names KNOWN_EVENT.
UNICODE_BODIES: dict[str, dict[str, Any]] = {
    "POST /v1/select": {
        "context": {"user": {"country": "fr", "tags": ["a", "b"]}, "hour": 13},
        "event_id": "unicode-1",
        "arms": ["arm-0", "arm-1"],
        "exclude": ["arm-1"],
        "baseline_arm": "arm-0",
        "unit_id": "user-1",
        "arm_features": {"arm-0": {"colour": "red"}},
    },
    "POST /v1/select/validate": {
        "context": {"user": {"country": "fr", "tags": ["a", "b"]}, "hour": 13},
        "event_id": "unicode-2",
        "arms": ["arm-0", "arm-1"],
        "arm_features": {"arm-0": {"colour": "red"}},
    },
    "POST /v1/reward": {"event_id": KNOWN_EVENT, "value": 1.0, "metrics": {"latency_ms": 1.0}},
    "POST /v1/arms": {"id": "unicode-arm", "features": None},
    "PUT /v1/admin/pin": {"version": 1},
    "PUT /v1/admin/checkpoints/{version}": {"status": "promoted", "reason": "checked"},
    RANK: {
        "contextFeatures": [{"timeOfDay": "Morning", "user": {"tier": "gold"}}],
        "actions": [
            {"id": "arm-0", "features": [{"type": "News", "tags": ["x"]}]},
            {"id": "arm-1", "features": []},
        ],
        "excludedActions": ["arm-1"],
        "eventId": "unicode-rank-1",
    },
    REWARD: {"value": 1.0},
}
#: Bytes that are never UTF-8: a stray continuation, a truncated sequence, an encoded
#: surrogate, an overlong form, bytes beyond U+10FFFF, Latin-1.
NOT_UTF8 = (b"\x80", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf5\x80\x80\x80", b"\xe9", b"\xff")
PLACEHOLDER = "\u2603"  # replaced by the bad bytes once the body is encoded


def _places(value: Any, loc: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[Any, ...], bool]]:
    """The path of every string of a JSON value and whether it is a key."""
    if isinstance(value, str):
        yield loc, False
    elif isinstance(value, dict):
        for key, item in value.items():
            yield (*loc, key), True
            yield from _places(item, (*loc, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _places(item, (*loc, index))


def _with(value: Any, loc: tuple[Any, ...], is_key: bool, edit: Any) -> Any:
    """`value` with the string at `loc` (the key itself if `is_key`) replaced by `edit(s)`."""
    if not loc:
        return edit(value)
    head, rest = loc[0], loc[1:]
    if isinstance(value, list):
        return [
            _with(item, rest, is_key, edit) if i == head else item for i, item in enumerate(value)
        ]
    if is_key and not rest:
        return {(edit(k) if k == head else k): item for k, item in value.items()}
    return {k: _with(item, rest, is_key, edit) if k == head else item for k, item in value.items()}


def _shown(loc: tuple[Any, ...], is_key: bool, text: str) -> str:
    """The field an error names for the bad string `text` at `loc`."""
    parts = [str(part) for part in loc]
    if is_key:
        parts[-1] = text
    return ".".join(parts) or "body"


def test_fuzz_invalid_unicode_anywhere(server: Server) -> None:
    """Every string of every JSON body, keys and values, with a lone surrogate (a valid JSON
    escape) or bytes that are not UTF-8 put in at a random place: a 422 naming that string
    (the facade's 400), never a 5xx, and nothing changes."""
    seed = int(FUZZ_SEED) if FUZZ_SEED else random.randrange(2**32)
    rng = random.Random(seed)
    served = _raw_schema(server.base_url)["paths"]
    json_operations = {
        f"{method.upper()} {path}"
        for path, operations in served.items()
        for method, operation in operations.items()
        if "application/json" in operation.get("requestBody", {}).get("content", {})
    }
    assert json_operations == set(UNICODE_BODIES), "give every JSON operation a body here"
    before = State.read(server.database)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"}
    refused: Counter[str] = Counter()
    with httpx.Client(base_url=server.base_url, headers=admin, timeout=30) as client:
        for operation, body in UNICODE_BODIES.items():
            method, template = operation.split(" ", 1)
            path = template.replace("{eventId}", KNOWN_EVENT).replace("{version}", "1")
            for loc, is_key in _places(body):
                for content, field in _corruptions(body, loc, is_key, rng):
                    response = client.request(method, path, content=content)
                    where = f"seed {seed}: {operation} {content!r} -> {response.text}"
                    assert response.status_code == (400 if operation in (RANK, REWARD) else 422), (
                        where
                    )
                    error = response.json()["error"]
                    assert error.get("field", error.get("target")) == field, where
                    refused[operation] += 1
    assert State.read(server.database) == before
    assert all(refused[operation] >= 2 for operation in UNICODE_BODIES), refused
    assert "Traceback" not in server.log.read_text(errors="replace")


def _corruptions(
    body: dict[str, Any], loc: tuple[Any, ...], is_key: bool, rng: random.Random
) -> Iterator[tuple[bytes, str]]:
    """`body` with the string at `loc` spoilt twice: a lone surrogate, bytes not UTF-8;
    each with the field its error must name."""
    original = loc[-1] if is_key else _at(body, loc)
    cut = rng.randint(0, len(original))
    surrogate = chr(rng.randint(0xD800, 0xDFFF))
    spoilt = _with(body, loc, is_key, lambda s: s[:cut] + surrogate + s[cut:])
    shown = original[:cut] + f"\\u{ord(surrogate):04x}" + original[cut:]
    yield json.dumps(spoilt).encode(), _shown(loc, is_key, shown)
    bad = rng.choice(NOT_UTF8)
    marked = _with(body, loc, is_key, lambda s: s[:cut] + PLACEHOLDER + s[cut:])
    encoded = json.dumps(marked, ensure_ascii=False).encode().replace(PLACEHOLDER.encode(), bad)
    shown = original[:cut] + "".join(f"\\x{byte:02x}" for byte in bad) + original[cut:]
    yield encoded, _shown(loc, is_key, shown)


def _at(value: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        value = value[part]
    return value


def test_fuzz_without_a_key(server: Server) -> None:
    run = fuzz(server, "no key", None, max(10, FUZZ_EXAMPLES // 5))
    _assert_clean(run, server)
    for operation, counts in run.statuses.items():
        if not operation.split(" ", 1)[1].startswith(OPEN_PATHS):
            assert not any(200 <= s < 300 for s in counts), (operation, counts)
            assert counts[401] > 0 or set(counts) == {405}, (operation, counts)


def test_fuzz_with_the_client_key(server: Server) -> None:
    run = fuzz(server, "client key", CLIENT_KEY, max(10, FUZZ_EXAMPLES // 5))
    _assert_clean(run, server)
    for operation, counts in run.statuses.items():
        if operation.split(" ", 1)[1].startswith(ADMIN_PATHS) and operation != "GET /v1/arms":
            assert not any(200 <= s < 300 for s in counts), (operation, counts)
    assert run.statuses["POST /v1/select"][200] > 0
    assert run.statuses[RANK][201] > 0  # the facade's example ranks the demo's arms


def test_fuzz_with_the_admin_key(server: Server) -> None:
    run = fuzz(server, "admin key", ADMIN_KEY, FUZZ_EXAMPLES)
    _assert_clean(run, server)
    # The fuzzer reached the service's logic, not only its validation.
    assert run.statuses["POST /v1/select"][200] > 0
    assert run.statuses["POST /v1/reward"][200] > 0
    assert run.statuses["POST /v1/arms"][201] > 0
    assert run.statuses["DELETE /v1/arms/{arm_id}"][200] > 0
    assert run.statuses["PUT /v1/admin/pin"][200] > 0
