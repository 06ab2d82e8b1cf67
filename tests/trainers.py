"""Trainer scenarios shared by the SQLite (unit) and Postgres (integration) tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import func, select

from rofu.service.db import repository
from rofu.service.db import rewards as reward_rows
from rofu.service.db.engine import SessionFactory
from rofu.service.db.tables import CheckpointRow, DecisionRow
from rofu.service.lifecycle.bus import CheckpointBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.trainer import Trainer, TrainReport
from rofu.service.metrics import ServiceMetrics
from rofu.service.settings import Settings
from tests.factories import decision_row


def log_decisions(sessions: SessionFactory, prefix: str, n: int, *, rewarded: bool = True) -> None:
    """`n` decisions (4 features) between two arms, rewarded unless `rewarded` is False."""
    for i in range(n):
        row = decision_row(
            f"{prefix}-{i}",
            [i / n, 1.0, -1.0, 0.5],
            arm=f"arm-{i % 2}",
            slot=i % 2,
            candidates=["arm-0", "arm-1"],
            propensity=0.5,
        )
        repository.save_decision(sessions, row)
        if rewarded:
            reward_rows.attach_reward(sessions, f"{prefix}-{i}", float(i % 2))


def marks(sessions: SessionFactory) -> dict[int | None, int]:
    """How many decisions each version consumed (None: not consumed yet)."""
    query = select(DecisionRow.trained_in, func.count()).group_by(DecisionRow.trained_in)
    with sessions() as session:
        return dict(session.execute(query).all())


def damage(sessions: SessionFactory, version: int) -> None:
    """Flip one bit inside a stored checkpoint's tensors (in its file or its row); the
    header and the recorded checksum stay as they were."""
    with sessions() as session, session.begin():
        row = session.get(CheckpointRow, version)
        assert row is not None
        blob = bytearray(Path(row.path).read_bytes() if row.path else bytes(row.blob or b""))
        blob[-10] ^= 0x01
        if row.path:
            Path(row.path).write_bytes(bytes(blob))
        else:
            row.blob = bytes(blob)


class NoLock:
    """A trainer lock that never refuses: a trainer that ignores the lock (an old build,
    a misconfiguration), to show that the claim alone keeps rows from training twice."""

    @contextlib.contextmanager
    def hold(self) -> Iterator[bool]:
        """Always taken."""
        yield True


@dataclass
class Interleaving:
    """The issue's order: B reads the closed decisions, A runs, then B goes on."""

    a: TrainReport | None  # A's run, inside B's
    b: TrainReport | None  # B's run
    metrics: ServiceMetrics  # B's


def force_interleaving(
    settings: Settings,
    sessions: SessionFactory,
    store: CheckpointStore,
    bus: CheckpointBus,
    monkeypatch: pytest.MonkeyPatch,
    *,
    a_ignores_the_lock: bool,
) -> Interleaving:
    """Train v1 on 10 rows, log 40 more, then run trainer B with trainer A's whole run
    forced between B's read of the closed decisions and B's read of `latest`."""
    log_decisions(sessions, "first", 10)
    a = Trainer(settings, sessions, store, bus, lock=NoLock() if a_ignores_the_lock else None)
    metrics = ServiceMetrics()
    b = Trainer(settings, sessions, store, bus, metrics)
    first = a.run_once()
    assert first is not None
    assert first.version == 1
    log_decisions(sessions, "second", 40)
    real = repository.closed_decisions
    inside: list[TrainReport | None] = []

    def b_reads_then_a_runs(*args: object, **kwargs: object) -> list[repository.TrainingRow]:
        rows = real(*args, **kwargs)  # type: ignore[arg-type]
        if not inside:  # B's read (A's own read below finds this list non-empty)
            inside.append(None)
            inside[0] = a.run_once()
        return rows

    monkeypatch.setattr(repository, "closed_decisions", b_reads_then_a_runs)
    b_report = b.run_once()
    monkeypatch.setattr(repository, "closed_decisions", real)
    return Interleaving(inside[0], b_report, metrics)


def assert_trained_once(sessions: SessionFactory, outcome: Interleaving) -> None:
    """Whoever trained the 40 rows, they were trained exactly once, on top of v1."""
    stored = repository.list_checkpoints(sessions)
    assert [row.version for row in stored] == [2, 1]
    assert (stored[0].rows_trained, stored[0].n_total) == (40, 50)
    assert marks(sessions) == {1: 10, 2: 40}
