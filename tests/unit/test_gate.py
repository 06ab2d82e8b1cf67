"""The evaluation gate on SQLite: its decision rule, its settings, and the state of
checkpoints under the trainer and an operator (`rofu.service.lifecycle.gate_admin`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from rofu.service.db import gate_status, quarantine, repository
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.db.tables import CANDIDATE, PROMOTED, REJECTED, utcnow
from rofu.service.errors import Conflict, NotFound
from rofu.service.lifecycle import gate_admin, pinning
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.gate import Judgment
from rofu.service.log.off_policy import Interval, bootstrap_interval, mean_interval
from rofu.service.settings import Settings
from tests.support import app_client, seed_checkpoint


def test_gate_rule_promotes_down_to_the_tolerance_and_rejects_below() -> None:
    serving = Interval(1.0, 0.9, 1.1, 300)
    assert Judgment(Interval(1.0, 0.98, 1.02, 300), serving, 0.02).promote
    assert Judgment(Interval(0.9, 0.981, 1.0, 300), serving, 0.02).promote
    assert not Judgment(Interval(1.2, 0.97, 1.4, 300), serving, 0.02).promote  # too wide
    assert not Judgment(Interval(0.5, math.nan, math.nan, 1), serving, 1.0).promote
    figures = Judgment(Interval(0.5, 0.4, 0.6, 300), serving, 0.02).figures(utcnow())
    assert figures["by"] == "gate"
    assert figures["rows"] == 300
    assert "below the serving model's logged value 1" in figures["reason"]


def test_gate_settings_auto_is_on_in_production_only_and_the_window_holds_the_minimum() -> None:
    production = {"database_url": "postgresql://db/rofu", "redis_url": "redis://r"}
    assert not Settings().gate_on
    assert Settings(mode="production", **production).gate_on
    assert not Settings(mode="production", gate="off", **production).gate_on
    assert Settings(gate="on").gate_on
    with pytest.raises(ValidationError, match="gate_window is below gate_min_rows"):
        Settings(gate_min_rows=500, gate_window=100)


@pytest.fixture
def stored(sqlite_settings):
    """v1 and v2 promoted (as stored before the gate), v3 a candidate."""
    for version in (1, 2, 3):
        seed_checkpoint(sqlite_settings, n_rows=20, version=version)
    engine = make_engine(sqlite_settings.database_url)
    sessions = session_factory(engine)
    assert gate_status.mark(sessions, 3, CANDIDATE, {})
    yield sessions
    engine.dispose()


def test_gate_candidate_is_neither_served_nor_pinnable_until_promoted(
    stored, sqlite_settings
) -> None:
    latest = repository.latest_checkpoint(stored, with_blob=False)
    assert latest is not None
    assert latest.version == 2
    assert gate_status.pending(stored).version == 3
    store = CheckpointStore(stored)
    net, seed = sqlite_settings.served_net_configs(), sqlite_settings.feature_hash_seed
    with pytest.raises(Conflict, match="candidate, not promoted: promote it first"):
        pinning.pin(stored, store, net, 3, hash_seed=seed)
    row = gate_admin.decide(stored, 3, PROMOTED, "looked fine")
    assert (row.gate_status, row.gate["by"], row.gate["reason"]) == (
        PROMOTED,
        "operator",
        "looked fine",
    )
    assert row.gate["replaced"]["status"] == CANDIDATE
    assert repository.latest_checkpoint(stored, with_blob=False).version == 3
    assert gate_status.pending(stored) is None
    assert not gate_status.mark(stored, 3, REJECTED, {}, was=CANDIDATE)  # the gate lost the race
    pinning.pin(stored, store, net, 3, hash_seed=seed)


def test_gate_operator_mistakes_are_refused_and_change_nothing(stored) -> None:
    with pytest.raises(NotFound, match="no checkpoint with version 9"):
        gate_admin.decide(stored, 9, PROMOTED)
    quarantine.quarantine(stored, 3, "damaged")
    with pytest.raises(Conflict, match="quarantined"):
        gate_admin.decide(stored, 3, PROMOTED)
    repository.set_pin(stored, 2)
    with pytest.raises(Conflict, match="pinned: unpin it first"):
        gate_admin.decide(stored, 2, REJECTED)
    repository.set_pin(stored, None)
    assert gate_admin.decide(stored, 2, REJECTED).gate_status == REJECTED
    with pytest.raises(Conflict, match="the only promoted checkpoint"):
        gate_admin.decide(stored, 1, REJECTED)
    statuses = {row.version: row.gate_status for row in repository.list_checkpoints(stored)}
    assert statuses == {1: PROMOTED, 2: REJECTED, 3: CANDIDATE}
    with pytest.raises(ValueError, match="status must be one of"):
        gate_admin.decide(stored, 1, CANDIDATE)


@pytest.mark.anyio
async def test_gate_admin_route_rejects_the_served_checkpoint_and_the_replica_goes_back(
    sqlite_settings,
) -> None:
    for version in (1, 2):
        seed_checkpoint(sqlite_settings, n_rows=20, version=version)
    async with app_client(sqlite_settings) as (client, _):
        assert (await client.get("/v1/model")).json()["version"] == 2
        path = "/v1/admin/checkpoints"
        body = {"status": "rejected", "reason": "bad rewards"}
        rejected = await client.put(f"{path}/2", json=body)
        assert rejected.status_code == 200, rejected.text
        assert rejected.json()["serving"] == 1
        assert rejected.json()["checkpoint"]["gate"]["reason"] == "bad rewards"
        only = await client.put(f"{path}/1", json={"status": "rejected"})
        missing = await client.put(f"{path}/7", json={"status": "promoted"})
        wrong = await client.put(f"{path}/1", json={"status": "candidate"})
        listed = (await client.get("/v1/model/checkpoints")).json()
        again = await client.put(f"{path}/2", json={"status": "promoted"})
    assert (only.status_code, only.json()["error"]["code"]) == (409, "conflict")
    assert missing.status_code == 404
    assert wrong.status_code == 422
    assert [(row["version"], row["gate_status"]) for row in listed] == [
        (2, "rejected"),
        (1, "promoted"),
    ]
    assert again.json()["serving"] == 2


def test_gate_bootstrap_interval_matches_the_normal_one_on_symmetric_terms_and_follows_skew() -> (
    None
):
    rng = np.random.default_rng(3)
    normal = rng.normal(1.0, 0.5, 2000)
    boot, plain = bootstrap_interval(normal, seed=1), mean_interval(normal)
    assert boot.value == plain.value
    assert boot.low == pytest.approx(plain.low, abs=0.004)
    assert boot.high == pytest.approx(plain.high, abs=0.004)
    assert bootstrap_interval(normal, seed=1) == boot  # the same resamples from the seed
    # a few rows with large importance weights: a long right tail
    skewed = np.where(rng.random(2000) < 0.01, 40.0, 0.0)
    boot, plain = bootstrap_interval(skewed, seed=1), mean_interval(skewed)
    assert boot.low > plain.low  # the mean's sampling distribution is skewed right
    assert boot.high - boot.value > boot.value - boot.low
    assert np.isnan(bootstrap_interval(np.array([1.0])).low)
