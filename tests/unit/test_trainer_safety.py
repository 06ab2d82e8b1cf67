"""The trainer on SQLite: a corrupt checkpoint is quarantined and training goes on from
the newest valid one, two trainers never train a row twice, and a run with nothing to
train on stores no version."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from datetime import timedelta
from typing import Any

import pytest

from rofu.models import load_checkpoint
from rofu.service import migrate
from rofu.service.db import repository
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.db.tables import TrainerLeaseRow, utcnow
from rofu.service.db.trainer_lock import LeaseLock, trainer_lock
from rofu.service.lifecycle.bus import InProcessBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.metrics import ServiceMetrics
from tests.support import app_client
from tests.trainers import (
    assert_trained_once,
    damage,
    force_interleaving,
    log_decisions,
    marks,
)


@pytest.fixture
def dir_settings(sqlite_settings, tmp_path):
    """Embedded settings with the checkpoints in a directory (ROFU_CHECKPOINT_DIR)."""
    return sqlite_settings.model_copy(update={"checkpoint_dir": tmp_path / "checkpoints"})


@pytest.fixture
def sessions(sqlite_settings):
    migrate.upgrade(sqlite_settings.database_url)
    engine = make_engine(sqlite_settings.database_url)
    yield session_factory(engine)
    engine.dispose()


@pytest.fixture
def reads(monkeypatch) -> list[int]:
    """The checkpoint versions whose stored bytes are read, in order."""
    seen: list[int] = []
    real = CheckpointStore._read

    def recording(row: Any) -> bytes:
        seen.append(row.version)
        return real(row)

    monkeypatch.setattr(CheckpointStore, "_read", staticmethod(recording))
    return seen


def _trainer(runtime: Any) -> Trainer:
    return Trainer(
        runtime.settings, runtime.sessions, runtime.store, runtime.local_bus, runtime.metrics
    )


def _quarantined(runtime: Any) -> float:
    return float(runtime.metrics.checkpoints_quarantined._value.get())


@pytest.mark.anyio
async def test_trainer_quarantines_a_corrupt_newest_checkpoint_once_and_trains_on(
    dir_settings, reads, caplog
):
    async with app_client(dir_settings) as (client, app):
        runtime = app.state.runtime
        trainer = _trainer(runtime)
        for prefix, version in (("a", 1), ("b", 2)):
            log_decisions(runtime.sessions, prefix, 8)
            assert trainer.run_once().version == version
        damage(runtime.sessions, 2)
        log_decisions(runtime.sessions, "c", 6)

        third = trainer.run_once()  # finds v2 damaged: quarantines it, trains from v1
        assert (third.version, third.consumed) == (3, 6)
        assert _quarantined(runtime) == 1
        assert "checkpoint 2 quarantined" in caplog.text
        assert (
            "checksum does not match"
            in repository.get_checkpoint(runtime.sessions, 2).quarantine_reason
        )
        row, blob = runtime.store.latest()
        assert (row.version, load_checkpoint(blob).extra["parent_version"]) == (3, "1")
        assert row.n_total == 8 + 6

        fourth = trainer.run_once()  # v2's decisions, released by the quarantine
        assert (fourth.version, fourth.consumed, fourth.rewarded) == (4, 8, 8)
        assert trainer.run_once() is None
        assert marks(runtime.sessions) == {1: 8, 3: 6, 4: 8}  # each decision once, none lost
        assert repository.latest_checkpoint(runtime.sessions).n_total == 22
        assert runtime.follower.serving == 4
        assert reads.count(2) == 1  # read once, when found damaged

        reads.clear()
        runtime.follower.sync()
        assert (await client.put("/v1/admin/pin", json={"version": 2})).status_code == 409
        log_decisions(runtime.sessions, "d", 4)
        assert trainer.run_once().version == 5
        assert 2 not in reads  # never read again
        assert _quarantined(runtime) == 1
        ready = await client.get("/readyz")
        assert (ready.status_code, ready.json()["checks"]["model"]) == (200, "loaded")


@pytest.mark.anyio
async def test_pin_works_whatever_is_corrupt_and_a_corrupt_one_is_refused(dir_settings):
    async with app_client(dir_settings) as (client, app):
        runtime = app.state.runtime
        trainer = _trainer(runtime)
        for prefix in ("a", "b"):
            log_decisions(runtime.sessions, prefix, 6)
            trainer.run_once()
        damage(runtime.sessions, 2)

        pinned = await client.put("/v1/admin/pin", json={"version": 1})
        assert pinned.json() == {"pinned": 1, "serving": 1}
        refused = await client.put("/v1/admin/pin", json={"version": 2})
        error = refused.json()["error"]
        assert (refused.status_code, error["code"], error["field"]) == (409, "conflict", "version")
        assert "checkpoint 2 cannot be pinned" in error["message"]
        assert "damaged" in error["message"]
        again = (await client.put("/v1/admin/pin", json={"version": 2})).json()["error"]
        assert "quarantined" in again["message"]
        assert _quarantined(runtime) == 1
        assert (await client.get("/v1/admin/pin")).json() == {"pinned": 1, "serving": 1}

        log_decisions(runtime.sessions, "c", 6)
        assert trainer.run_once().version == 3  # trained while pinned, from v1
        assert runtime.follower.serving == 1
        unpinned = await client.delete("/v1/admin/pin")
        assert unpinned.json() == {"pinned": None, "serving": 3}


@pytest.mark.parametrize("a_ignores_the_lock", [False, True], ids=["locked", "claim"])
def test_two_trainers_in_the_issue_order_train_no_row_twice(
    sqlite_settings, sessions, monkeypatch, a_ignores_the_lock
):
    store = CheckpointStore(sessions)
    outcome = force_interleaving(
        sqlite_settings,
        sessions,
        store,
        InProcessBus(),
        monkeypatch,
        a_ignores_the_lock=a_ignores_the_lock,
    )
    assert_trained_once(sessions, outcome)
    skipped = outcome.metrics.trainer_skipped
    if a_ignores_the_lock:  # A stored v2 on the 40 rows: B's claim finds them taken
        assert (outcome.a.version, outcome.a.consumed) == (2, 40)
        assert outcome.b is None
        assert skipped.labels("claim_lost")._value.get() == 1
    else:  # B held the lock: A stood by, B trained
        assert outcome.a is None
        assert (outcome.b.version, outcome.b.consumed) == (2, 40)
        assert skipped.labels("claim_lost")._value.get() == 0


def test_a_run_with_nothing_to_train_on_stores_no_version(sqlite_settings, sessions, caplog):
    caplog.set_level(logging.INFO, logger="rofu.trainer")
    published: list[int] = []
    bus = InProcessBus()
    bus.subscribe(lambda version, _blob: published.append(version))
    metrics = ServiceMetrics()
    trainer = Trainer(sqlite_settings, sessions, CheckpointStore(sessions), bus, metrics)
    log_decisions(sessions, "none-yet", 3, rewarded=False)
    empty = trainer.run_once()
    assert (empty.version, empty.consumed, empty.excluded, empty.loss) == (0, 3, 3, None)
    log_decisions(sessions, "paid", 5)
    assert trainer.run_once().version == 1
    for batch in range(3):  # no reward and no default_reward: nothing to learn from
        log_decisions(sessions, f"unpaid-{batch}", 4, rewarded=False)
        report = trainer.run_once()
        assert (report.version, report.consumed, report.excluded, report.loss) == (1, 4, 4, None)
    assert [row.version for row in repository.list_checkpoints(sessions)] == [1]
    assert published == [1]
    assert metrics.trainer_published._value.get() == 1
    assert marks(sessions) == {0: 3, 1: 5 + 12}
    assert "nan" not in caplog.text
    assert "none to train on (4 excluded); no new checkpoint" in caplog.text


def test_the_sqlite_lease_admits_one_trainer_at_a_time(sessions):
    assert isinstance(trainer_lock(sessions), LeaseLock)
    first, second = LeaseLock(sessions), LeaseLock(sessions)
    with first.hold() as held:
        assert held
        with second.hold() as also:
            assert not also
    with second.hold() as held:
        assert held


def test_the_sqlite_lease_of_a_gone_process_is_taken_over(sessions):
    ended = subprocess.Popen(["true"])
    ended.wait()
    host = socket.gethostname()
    for holder, expires, taken in (
        (f"{host}:{ended.pid}:old:x", timedelta(hours=1), True),  # its process ended
        (f"{host}:{os.getpid()}:earlier:x", timedelta(hours=1), True),  # a restart, same pid
        (f"elsewhere:{os.getpid()}:p:x", timedelta(hours=1), False),  # another host: wait
        (f"elsewhere:{os.getpid()}:p:x", timedelta(hours=-1), True),  # ...until it expires
    ):
        with sessions() as session, session.begin():
            session.merge(TrainerLeaseRow(id=1, holder=holder, expires_at=utcnow() + expires))
        with LeaseLock(sessions).hold() as held:
            assert held is taken, holder


def test_a_checkpoint_over_the_byte_limit_is_neither_stored_nor_published(
    sqlite_settings, sessions
):
    published: list[int] = []
    bus = InProcessBus()
    bus.subscribe(lambda version, _blob: published.append(version))
    tight = sqlite_settings.model_copy(update={"max_checkpoint_bytes": 1000})
    trainer = Trainer(tight, sessions, CheckpointStore(sessions), bus)
    log_decisions(sessions, "big", 5)
    with pytest.raises(RuntimeError, match=r"over the limit of 1000 .*MAX_CHECKPOINT_BYTES"):
        trainer.run_once()
    assert repository.list_checkpoints(sessions) == []
    assert published == []
    assert marks(sessions) == {None: 5}  # the rows wait for a run under a limit that fits
    assert (
        Trainer(sqlite_settings, sessions, CheckpointStore(sessions), bus).run_once().version == 1
    )
