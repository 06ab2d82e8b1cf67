"""The evaluation gate on Postgres, on a simulated app whose reward rule is known: a
candidate trained on a poisoned batch (rewards negated) is rejected on the clean
decisions the serving model made after it, and the serving model stays served; the
next candidate, trained on clean rewards, is promoted and then served."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from rofu.service.db import repository
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.db.tables import DecisionRow
from rofu.service.lifecycle.bus import NullBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.gate import FIRST
from rofu.service.lifecycle.trainer import Trainer, TrainReport
from rofu.service.metrics import ServiceMetrics
from rofu.service.settings import Settings
from tests.simulated_app import KnownApp, service_settings
from tests.support import app_client

GATE = {"gate": "on", "gate_min_rows": 200, "gate_tolerance": 0.3, "exploration_floor": 0.2}


def _train(settings: Settings, metrics: ServiceMetrics) -> TrainReport | None:
    engine = make_engine(settings.database_url)
    try:
        sessions = session_factory(engine)
        store = CheckpointStore(sessions, settings.checkpoint_dir)
        return Trainer(settings, sessions, store, NullBus(), metrics).run_once()
    finally:
        engine.dispose()


def _unconsumed(settings: Settings) -> int:
    engine = make_engine(settings.database_url)
    try:
        query = select(func.count()).where(DecisionRow.trained_in.is_(None))
        with session_factory(engine)() as session:
            return int(session.scalar(query) or 0)
    finally:
        engine.dispose()


async def _checkpoints(settings: Settings) -> dict[int, dict[str, Any]]:
    async with app_client(settings) as (client, _):
        listed = (await client.get("/v1/model/checkpoints")).json()
        served = (await client.get("/v1/model")).json()["version"]
    return {row["version"]: row for row in listed} | {0: {"served": served}}


@pytest.mark.anyio
async def test_gate_rejects_a_poisoned_candidate_and_promotes_a_clean_one(pg_clean: str) -> None:
    settings = service_settings(pg_clean, **GATE)
    metrics = ServiceMetrics()
    app = KnownApp(seed=21)
    await app.serve(settings, "cold", 200)
    first = _train(settings, metrics)
    assert first is not None
    assert (first.version, first.status) == (1, "promoted")  # nothing served: no gate

    await app.serve(settings, "poison", 400, flip=True)
    poisoned = _train(settings, metrics)
    assert poisoned is not None
    assert (poisoned.version, poisoned.status) == (2, "candidate")
    assert metrics.gate_candidate._value.get() == 2

    early = await app.serve(settings, "clean", 100)
    assert {row.version for row in early} == {1}  # the candidate is not served
    assert _train(settings, metrics) is None  # 100 fresh rows < 200: undecided, nothing new
    assert _unconsumed(settings) == 100  # they wait for the next run

    await app.serve(settings, "clean-more", 150)
    after = _train(settings, metrics)  # rejects v2, then trains v3 on v1 with the 250 rows
    assert after is not None
    assert (after.version, after.status, after.consumed) == (3, "candidate", 250)
    stored = await _checkpoints(settings)
    assert stored[0]["served"] == 1
    assert stored[1]["gate"]["reason"] == FIRST
    rejected = stored[2]
    assert rejected["gate_status"] == "rejected"
    gate = rejected["gate"]
    assert gate["by"] == "gate"
    assert gate["rows"] == 250
    assert gate["candidate"]["low"] < gate["serving"]["value"] - gate["tolerance"]
    assert metrics.gate_decisions.labels("rejected")._value.get() == 1

    later = await app.serve(settings, "clean-last", 250)
    assert {row.version for row in later} == {1}
    promoted = _train(settings, metrics)  # promotes v3, then trains v4 on it
    assert promoted is not None
    assert (promoted.version, promoted.status) == (4, "candidate")
    stored = await _checkpoints(settings)
    assert stored[3]["gate_status"] == "promoted"
    assert stored[3]["gate"]["candidate"]["low"] >= stored[3]["gate"]["serving"]["value"] - 0.3
    assert stored[0]["served"] == 3  # a fresh replica serves the promoted candidate
    assert metrics.gate_decisions.labels("promoted")._value.get() == 1
    engine = make_engine(pg_clean)
    try:
        latest = repository.latest_checkpoint(session_factory(engine), with_blob=False)
    finally:
        engine.dispose()
    assert latest is not None
    assert latest.version == 3  # what the trainer continues from
