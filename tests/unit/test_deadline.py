"""A request's wait for the database is bounded whatever the server does (a frozen
Postgres enforces none of its own timeouts): past ROFU_REQUEST_DEADLINE_SECONDS, a 503."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from rofu.service.db import rewards as reward_rows
from rofu.service.deciding import batch as decision_batch
from tests.support import app_client
from tests.support import eventually as _eventually


@pytest.mark.anyio
async def test_a_hung_database_gives_a_503_at_the_deadline_and_the_retry_finds_the_work(
    sqlite_settings, monkeypatch
):
    settings = sqlite_settings.model_copy(update={"request_deadline_seconds": 0.5})
    release = threading.Event()
    attach, batch = reward_rows.attach_rewards, decision_batch.DecisionBatch.__call__

    def frozen_attach(*args, **kwargs):
        release.wait(10)  # the server answers nothing until released
        return attach(*args, **kwargs)

    def frozen_batch(self, items):
        release.wait(10)
        return batch(self, items)

    async with app_client(settings) as (client, app):
        chosen = await _answered(
            client, "/v1/select", {"context": [0.1, 0.2, 0.3, 0.4], "event_id": "warm-1"}
        )
        event_id = chosen.json()["event_id"]
        monkeypatch.setattr(reward_rows, "attach_rewards", frozen_attach)
        monkeypatch.setattr(decision_batch.DecisionBatch, "__call__", frozen_batch)
        for path, body in (
            ("/v1/reward", {"event_id": event_id, "value": 1.0}),
            ("/v1/select", {"context": [0.1, 0.2, 0.3, 0.4], "event_id": "frozen-1"}),
        ):
            started = time.monotonic()
            stalled = await client.post(path, json=body)
            assert time.monotonic() - started < 5.0
            assert stalled.status_code == 503, stalled.text
            assert stalled.headers["retry-after"] == "2"
            assert "ROFU_REQUEST_DEADLINE_SECONDS" in stalled.json()["error"]["message"]
        release.set()  # the server resumes: the work it held finishes
        monkeypatch.undo()
        await _eventually(lambda: _rewards(app) == 1)  # the held write landed, once
        retried = await _answered(client, "/v1/reward", {"event_id": event_id, "value": 1.0})
        assert retried.json()["duplicate"] is True  # stored once, by the first attempt
        again = await _answered(
            client, "/v1/select", {"context": [0.1, 0.2, 0.3, 0.4], "event_id": "frozen-1"}
        )
        assert again.status_code == 200


async def _answered(client, path: str, body: dict):
    """Post until the answer is not a deadline 503, as a client retries: the unfrozen
    requests also run under the short deadline, which a loaded CI machine can miss
    (a first /select once took longer than 0.5 s there). The retry carries the same
    event_id, so it finds the work of the attempt that timed out."""
    for _ in range(20):
        answer = await client.post(path, json=body)
        if answer.status_code != 503:
            return answer
    raise AssertionError(f"{path} still 503 after 20 tries: {answer.text}")


def _rewards(app) -> int:
    with app.state.runtime.engine.connect() as connection:
        return int(connection.execute(text("select count(*) from rewards")).scalar_one())
