"""The /select batch handler on SQLite: one write transaction per batch, idempotency keys
inside and across batches, races with another replica, and per-request failures.

The handler is called directly (as the batcher's worker thread would); the last tests go
through the HTTP app. Transactions are counted with SQLAlchemy engine events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import text

from rofu.service import migrate
from rofu.service.api.schemas import SelectRequest
from rofu.service.db import arms as arm_rows
from rofu.service.db import repository
from rofu.service.db.engine import SessionFactory, make_engine, session_factory
from rofu.service.deciding.batch import Decided, DecisionBatch, Pending, Result
from rofu.service.deciding.catalogue import CatalogueCache
from rofu.service.deciding.scoring import Scorer, SelectJob, SelectOutcome
from rofu.service.deciding.select import request_hash
from rofu.service.deciding.snapshot import SnapshotHolder
from rofu.service.errors import Conflict, InvalidInput, Unavailable
from rofu.service.settings import Settings
from tests.factories import decision_row
from tests.support import Transactions, app_client

ARMS = ["arm-0", "arm-1", "arm-2", "arm-3"]


class SpyScorer:
    """The real cold-start scorer, recording its batches; optional hooks per call."""

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer
        self.batches: list[list[SelectJob]] = []
        self.before: Callable[[], None] | None = None
        self.not_finite: set[float] = set()  # contexts whose first value gets None

    def __call__(self, jobs: list[SelectJob]) -> list[SelectOutcome | None]:
        self.batches.append(jobs)
        if self.before is not None:
            self.before()
        outcomes = self.scorer(jobs)
        return [
            None if job.context[0] in self.not_finite else outcome
            for job, outcome in zip(jobs, outcomes, strict=True)
        ]


class World:
    """A migrated SQLite database with four arms, and a decision batch handler on it."""

    def __init__(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path}/batch.sqlite"
        migrate.upgrade(url)
        self.engine = make_engine(url)
        self.sessions: SessionFactory = session_factory(self.engine)
        arm_rows.ensure_arms(self.sessions, [(arm, None) for arm in ARMS], max_arms=8)
        catalogue = CatalogueCache(self.sessions, ttl_s=3600)
        catalogue.refresh()
        settings = Settings(database_url=url, context_dim=2)
        self.scorer = SpyScorer(Scorer(SnapshotHolder(), catalogue, settings.rofu_config(), 0, 0))
        self.scored: list[int] = []
        self.handle = DecisionBatch(
            self.scorer, self.sessions, catalogue, on_scored=self.scored.append
        )
        self.tx = Transactions(self.engine)

    def count(self) -> int:
        with self.engine.connect() as connection:
            return int(connection.execute(text("select count(*) from decisions")).scalar_one())


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.engine.dispose()


def pending(context: list[float], event_id: str | None = None, **body: Any) -> Pending:
    request = SelectRequest(context=context, event_id=event_id, **body)
    return Pending(request, request_hash(request), tuple(context))


def decided(result: Result) -> Decided:
    assert isinstance(result, Decided), result
    return result


def test_decision_batch_stores_a_batch_in_one_transaction(world: World) -> None:
    batch = [pending([float(i), 0.5]) for i in range(8)]
    results = [decided(r) for r in world.handle(batch)]
    assert all(r.created for r in results)
    assert [r.row.context for r in results] == [[float(i), 0.5] for i in range(8)]
    assert len({r.row.event_id for r in results}) == 8
    assert world.count() == 8
    assert world.tx.commits == 1  # no key to look up, catalogue fresh: only the write
    assert world.tx.decision_writes() == ["commit"]
    assert world.scored == [8]


def test_decision_batch_same_key_twice_in_a_batch_gives_one_decision(world: World) -> None:
    batch = [
        pending([1.0, 2.0], "k-1"),
        pending([1.0, 2.0], "k-1"),  # the same request again: the first's decision
        pending([9.0, 9.0], "k-1"),  # the same key, another request: 409
        pending([3.0, 4.0]),
    ]
    first, again, clash, other = world.handle(batch)
    assert decided(first).created
    assert decided(again) == Decided(decided(first).row, created=False)
    assert isinstance(clash, Conflict)
    assert clash.field == "event_id"
    assert decided(other).created
    assert world.count() == 2
    assert world.tx.decision_writes() == ["commit"]  # one write for both new decisions


def test_decision_batch_replays_stored_keys_without_scoring(world: World) -> None:
    stored = decided(world.handle([pending([1.0, 2.0], "k-2")])[0]).row
    world.scorer.batches.clear()
    writes = len(world.tx.decision_writes())
    same, different = world.handle([pending([1.0, 2.0], "k-2"), pending([0.0, 2.0], "k-2")])
    assert (decided(same).row.event_id, decided(same).row.arm_id) == ("k-2", stored.arm_id)
    assert decided(same).created is False
    assert isinstance(different, Conflict)
    assert world.scorer.batches == []  # neither request reached ROFU
    assert len(world.tx.decision_writes()) == writes  # nor the database's write path
    assert world.count() == 1


def test_decision_batch_settles_a_key_won_by_another_replica(world: World) -> None:
    ours, theirs = pending([1.0, 2.0], "race-same"), pending([5.0, 6.0], "race-diff")

    def other_replica() -> None:  # stores both keys after our lookup, before our write
        row = decision_row("race-same", [1.0, 2.0], arm="arm-3", slot=3)
        row.request_hash = ours.digest
        repository.save_decision(world.sessions, row)
        repository.save_decision(world.sessions, decision_row("race-diff", [7.0, 7.0]))

    world.scorer.before = other_replica
    same, clash, fresh = world.handle([ours, theirs, pending([3.0, 3.0])])
    assert decided(same).created is False
    assert decided(same).row.arm_id == "arm-3"  # the decision the other replica stored
    assert isinstance(clash, Conflict)
    assert decided(fresh).created
    assert world.count() == 3
    # the other replica's two, our batch insert, then ours row by row (two lose the race)
    assert world.tx.decision_writes() == ["commit"] * 2 + ["rollback"] * 3 + ["commit"]


def test_decision_batch_refuses_per_request(world: World) -> None:
    world.scorer.not_finite = {7.0}
    batch = [
        pending([0.0, 1.0], arms=["ghost"]),
        pending([7.0, 1.0]),
        pending([0.0, 1.0], exclude=ARMS),
        pending([2.0, 1.0], arms=["arm-1"]),
    ]
    ghost, overflow, none_left, ok = world.handle(batch)
    assert isinstance(ghost, InvalidInput)
    assert ghost.field == "arms.0"
    assert isinstance(overflow, InvalidInput)
    assert overflow.field == "context"
    assert isinstance(none_left, InvalidInput)
    assert none_left.field == "exclude"
    assert decided(ok).row.arm_id == "arm-1"
    assert world.scored == [2]  # the refused candidate sets were never scored
    assert world.count() == 1


def test_decision_batch_failed_lookup_fails_only_keyed_requests(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(*_: object) -> None:
        raise Unavailable("database unavailable: OperationalError")

    monkeypatch.setattr(repository, "find_decisions", down)
    keyed, unkeyed = world.handle([pending([1.0, 1.0], "k-3"), pending([1.0, 1.0])])
    assert isinstance(keyed, Unavailable)
    assert decided(unkeyed).created
    assert world.count() == 1


def test_decision_batch_failed_write_fails_its_rows_not_replays(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = decided(world.handle([pending([1.0, 2.0], "k-4")])[0]).row

    def down(*_: object) -> None:
        raise Unavailable("database unavailable: OperationalError")

    monkeypatch.setattr(repository, "insert_decisions", down)
    replay, new_a, new_b = world.handle(
        [pending([1.0, 2.0], "k-4"), pending([0.0, 0.0], "k-5"), pending([0.0, 1.0])]
    )
    assert decided(replay).row.arm_id == stored.arm_id
    assert decided(replay).created is False
    assert isinstance(new_a, Unavailable)
    assert isinstance(new_b, Unavailable)
    assert world.count() == 1


def test_decision_batch_row_by_row_failure_fails_only_that_row(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository.save_decision(world.sessions, decision_row("taken", [0.0, 0.0]))
    monkeypatch.setattr(repository, "find_decisions", lambda *_: {})  # a missed lookup
    save = repository.save_decision

    def flaky(sessions: SessionFactory, row: Any) -> Any:
        if row.context == [6.0, 6.0]:
            raise Unavailable("database unavailable: OperationalError")
        return save(sessions, row)

    monkeypatch.setattr(repository, "save_decision", flaky)
    taken, failed, ok = world.handle(
        [pending([0.0, 0.0], "taken"), pending([6.0, 6.0]), pending([1.0, 1.0])]
    )
    assert isinstance(taken, Conflict)  # stored with another request hash
    assert isinstance(failed, Unavailable)
    assert decided(ok).created
    assert world.count() == 2


# Through the HTTP app --------------------------------------------------------------------


@pytest.mark.anyio
async def test_service_concurrent_selects_in_one_batch_share_one_commit(
    sqlite_settings: Settings,
) -> None:
    settings = sqlite_settings.model_copy(
        update={
            "batch_max_size": 6,
            "batch_max_wait_ms": 1000.0,  # only the sixth request flushes the batch
            "checkpoint_poll_seconds": 600,
            "arm_refresh_seconds": 600,
        }
    )
    async with app_client(settings) as (client, app):
        tx = Transactions(app.state.runtime.engine)
        bodies = [{"context": [float(i), 0.0, 0.0, 0.0]} for i in range(4)]
        bodies += [{"context": [1.0, 1.0, 1.0, 1.0], "event_id": "twice"}] * 2
        with anyio.fail_after(30):
            answers = await asyncio.gather(*(client.post("/v1/select", json=b) for b in bodies))
        metrics = (await client.get("/metrics")).text
        assert [a.status_code for a in answers] == [200] * 6
    assert answers[4].json() == answers[5].json()
    assert tx.decision_writes() == ["commit"]
    assert tx.commits == 2  # the key lookup and the write: one of each for six requests
    with app.state.runtime.engine.connect() as connection:
        assert connection.execute(text("select count(*) from decisions")).scalar_one() == 5
    assert "rofu_select_batch_size_count 1.0" in metrics
    assert 'rofu_selections_total{arm="' in metrics


@pytest.mark.anyio
async def test_service_select_takes_no_thread_pool_hop(
    sqlite_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = sqlite_settings.model_copy(update={"checkpoint_poll_seconds": 600})
    async with app_client(settings) as (client, _):
        hops: list[object] = []
        run_sync = anyio.to_thread.run_sync

        async def counting(function: Callable[..., object], *args: object, **kw: Any) -> object:
            hops.append(function)
            return await run_sync(function, *args, **kw)

        monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
        keyed = {"context": [0.0] * 4, "event_id": "hop"}
        for body in ({"context": [0.0] * 4}, keyed, keyed):  # new, new with a key, replay
            assert (await client.post("/v1/select", json=body)).status_code == 200
    assert hops == []


@pytest.mark.anyio
async def test_service_select_is_503_when_the_write_fails(
    sqlite_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(*_: object) -> None:
        raise Unavailable("database unavailable: OperationalError")

    async with app_client(sqlite_settings) as (client, _):
        monkeypatch.setattr(repository, "insert_decisions", down)
        response = await client.post("/v1/select", json={"context": [0.0] * 4})
    assert response.status_code == 503
    assert response.headers["retry-after"].isdigit()
    assert response.json()["error"]["code"] == "unavailable"


def test_stored_scores_are_typed_and_rows_of_the_old_layout_still_read() -> None:
    from rofu.models.scores import ArmScore
    from rofu.service.deciding.select import stored_scores

    row = decision_row("old", [0.0], candidates=["a", "b"])
    assert stored_scores(row) == [ArmScore.unscored("a"), ArmScore.unscored("b")]
    row.scores = {"a": [0.1, 0.2, 0.3], "b": None}  # written before 2026-11-25
    assert stored_scores(row) == [ArmScore("a", 0.1, 0.2, 0.3), ArmScore.unscored("b")]
    row.scores = [{"arm": "b", "mean": 1.0, "bonus": 0.5, "ucb": 1.5}]
    assert stored_scores(row) == [ArmScore("b", 1.0, 0.5, 1.5)]
