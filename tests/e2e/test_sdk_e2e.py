"""The SDK against a real `rofu serve`: select (deferred), reward, activate, arms, model
and export through `RofuClient`, and a retry through a 503 that reuses the event id.

The 503 comes from a small HTTP proxy in front of the server, standing in for a load
balancer whose backend answered too late: it forwards the first /v1/select to the server,
which stores the decision, then throws the answer away and replies 503 with Retry-After.
Only a retry that repeats the event id gets that stored decision back instead of making a
second one.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from rofu.client import RofuClient
from rofu.service.settings import ArmSpec, Settings
from tests.support import seed_checkpoint, service_process

ARMS = [f"item-{i}" for i in range(4)]
ADMIN_KEY = "sdk-admin-key-0123456789"
FORWARDED = ("authorization", "content-type")
RETURNED = ("content-type", "link", "retry-after")


class DroppingProxy:
    """Forwards every request to `upstream`; the first /v1/select's answer is replaced by a
    503 with Retry-After (after the server handled it). Records what it forwarded."""

    def __init__(self, upstream: str) -> None:
        self.selects: list[bytes] = []  # the bodies of the /v1/select requests it saw
        self.dropped = 0
        http = httpx.Client(base_url=upstream, timeout=30)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() in FORWARDED}
                answer = http.request(self.command, self.path, content=body, headers=headers)
                if self.path == "/v1/select":
                    proxy.selects.append(body)
                    if len(proxy.selects) == 1:
                        proxy.dropped += 1
                        self._reply(503, {"Retry-After": "1"}, b"{}")
                        return
                kept = {k: v for k, v in answer.headers.items() if k.lower() in RETURNED}
                self._reply(answer.status_code, kept, answer.content)

            def _reply(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, *args: object) -> None:  # quiet test output
                pass

        self._http = http
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close the upstream connections."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._http.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[DroppingProxy, Path]]:
    """A real service (SQLite, a seeded checkpoint, keys required) behind the proxy."""
    database = tmp_path / "rofu.sqlite"
    settings = Settings(
        database_url=f"sqlite:///{database}",
        context_dim=4,
        hidden=(16,),
        arms=[ArmSpec(id=a) for a in ARMS],
    )
    seed_checkpoint(settings, n_rows=100)
    env = {
        "ROFU_DATABASE_URL": settings.database_url,
        "ROFU_CONTEXT_DIM": "4",
        "ROFU_HIDDEN": "[16]",
        "ROFU_ARMS": '[{"id": "' + '"}, {"id": "'.join(ARMS) + '"}]',
        "ROFU_EMBEDDED_TRAINER": "false",
        "ROFU_ADMIN_API_KEYS": f'["{ADMIN_KEY}"]',
        "ROFU_REWARD_WINDOW_SECONDS": "600",
    }
    with service_process(env, tmp_path / "service.log") as base_url:
        proxy = DroppingProxy(base_url)
        try:
            yield proxy, database
        finally:
            proxy.close()


def _stored(database: Path) -> list[tuple[str, str, int]]:
    with sqlite3.connect(database) as db:
        query = "select event_id, arm_id, deferred from decisions order by created_at"
        return [(e, a, int(d)) for e, a, d in db.execute(query).fetchall()]


def test_sdk_round_trip_against_rofu_serve_retries_a_503_with_the_same_event_id(served):
    proxy, database = served
    with RofuClient(proxy.url, api_key=ADMIN_KEY, retries=3) as rofu:
        decision = rofu.select([0.2, -0.4, 0.9, 0.1], defer=True)  # the client draws the id
        assert proxy.dropped == 1
        assert len(proxy.selects) == 2
        assert proxy.selects[0] == proxy.selects[1]  # the retry repeated the request, key too
        assert _stored(database) == [(decision.event_id, decision.arm, 1)]
        assert (decision.deferred, decision.model_version, decision.policy) == (True, 1, "rofu")

        rewarded = rofu.reward(decision.event_id, 1.0)
        assert (rewarded.duplicate, rewarded.late) == (False, False)
        activated = rofu.activate(decision.event_id)
        assert (activated.status, activated.deferred) == ("activated", True)
        assert rofu.activate(decision.event_id).status == "already_active"
        assert [arm.id for arm in rofu.arms()] == ARMS
        assert rofu.model().version == 1
        plain = rofu.select([0.0, 0.5, -0.5, 1.0], arms=ARMS[:2])

        records = list(rofu.export(page_size=1))  # one record a page: the Link headers
    assert [r.event_id for r in records] == [decision.event_id, plain.event_id]
    first, second = records
    assert (first.arm, first.reward, first.deferred, first.active) == (
        decision.arm,
        1.0,
        True,
        True,
    )
    assert first.activated_at is not None
    assert [p.probability for p in decision.probabilities or []] == first.probabilities
    assert (second.candidates, second.reward, second.deferred) == (ARMS[:2], None, False)
    assert len(_stored(database)) == 2
