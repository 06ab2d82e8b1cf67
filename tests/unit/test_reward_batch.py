"""Rewards stored a micro-batch at a time on SQLite: one transaction per batch, each post
with the outcome or error it would get posted alone, in order; a database failure fails
the whole batch and stores nothing. The last test goes through the HTTP app.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, event, text, update

from rofu.service import migrate
from rofu.service.db import repository
from rofu.service.db import rewards as reward_rows
from rofu.service.db.engine import SessionFactory, make_engine, session_factory
from rofu.service.db.rewards import RewardPost, Stored
from rofu.service.db.tables import DecisionRow, utcnow
from rofu.service.deciding.batcher import MicroBatcher
from rofu.service.errors import Conflict, NotFound, Unavailable
from rofu.service.rewards.record import RewardBatch
from rofu.service.settings import Settings
from tests.factories import decision_row
from tests.support import Transactions, app_client, eventually

WINDOW = 60.0
DECIDED = ("new", "dup", "clash", "consumed", "old", "twice-same", "twice-diff")
POSTS = [  # (event id, value): every case of a post, in one batch
    ("new", 0.5),
    ("dup", 1.0),  # rewarded 1.0 before: a duplicate
    ("clash", 2.0),  # rewarded 1.0 before: a conflict
    ("unknown", 1.0),  # no such decision
    ("consumed", 1.0),  # a checkpoint consumed it: late
    ("old", -1.0),  # decided before the window: late
    ("twice-same", 0.25),
    ("twice-same", 0.25),  # a duplicate of the post just before
    ("twice-diff", 0.25),
    ("twice-diff", 0.75),  # a conflict with the post just before
    ("dup", 1.0),  # a second duplicate of the same event
    ("consumed", 1.0),  # a duplicate of a late reward: late
]
EXPECTED = [  # (value, duplicate, late, joins its decision) or the error's class
    (0.5, False, False, True),
    (1.0, True, False, False),
    Conflict,
    NotFound,
    (1.0, False, True, True),
    (-1.0, False, True, True),
    (0.25, False, False, True),
    (0.25, True, False, False),
    (0.25, False, False, True),
    Conflict,
    (1.0, True, False, False),
    (1.0, True, True, False),
]


class World:
    """A migrated SQLite database holding the decisions of `DECIDED`: `dup` and `clash`
    rewarded 1.0, `consumed` taken by checkpoint 1, `old` decided two windows ago."""

    def __init__(self, path: Path) -> None:
        url = f"sqlite:///{path}"
        migrate.upgrade(url)
        self.engine = make_engine(url)
        self.sessions: SessionFactory = session_factory(self.engine)
        rows = [decision_row(event_id, [0.0, 1.0]) for event_id in DECIDED]
        repository.insert_decisions(self.sessions, rows)
        for event_id in ("dup", "clash"):
            reward_rows.attach_reward(self.sessions, event_id, 1.0)
        repository.mark_consumed(self.sessions, ["consumed"], 1)
        with self.sessions() as session, session.begin():
            session.execute(
                update(DecisionRow)
                .where(DecisionRow.event_id == "old")
                .values(created_at=utcnow() - timedelta(seconds=2 * WINDOW))
            )

    def rewards(self) -> list[tuple[str, float, int, bool]]:
        query = "select event_id, value, repeats, late from rewards order by event_id"
        with self.engine.connect() as connection:
            rows = connection.execute(text(query)).all()
        return [(event_id, value, repeats, bool(late)) for event_id, value, repeats, late in rows]


@pytest.fixture
def worlds(tmp_path: Path) -> Iterator[tuple[World, World]]:
    """Two identical databases: one takes the posts as a batch, one post by post."""
    pair = World(tmp_path / "batch.sqlite"), World(tmp_path / "alone.sqlite")
    yield pair
    for world in pair:
        world.engine.dispose()


def _one_by_one(world: World) -> list[Stored]:
    results: list[Stored] = []
    for event_id, value in POSTS:
        try:
            results.append(reward_rows.attach_reward(world.sessions, event_id, value, WINDOW))
        except (NotFound, Conflict) as exc:
            results.append(exc)
    return results


def _seen(result: Stored) -> tuple[Any, ...]:
    """What a caller sees of a post's result (the decision: which one it joins)."""
    if isinstance(result, Exception):
        return (type(result), str(result), result.field)
    joined = None if result.decision is None else result.decision.event_id
    return (result.event_id, result.value, result.duplicate, result.late, joined)


def test_reward_batch_gives_each_post_what_it_gets_posted_alone(
    worlds: tuple[World, World],
) -> None:
    batched, alone = worlds
    tx = Transactions(batched.engine)
    results = RewardBatch(batched.sessions, WINDOW)([RewardPost(*post) for post in POSTS])
    assert tx.commits == 1
    assert [_seen(r) for r in results] == [_seen(r) for r in _one_by_one(alone)]
    for (event_id, _), result, expected in zip(POSTS, results, EXPECTED, strict=True):
        if isinstance(expected, type):
            assert isinstance(result, expected), (event_id, result)
            continue
        assert not isinstance(result, Exception), (event_id, result)
        joins = result.decision is not None and result.decision.event_id == event_id
        assert (result.value, result.duplicate, result.late, joins) == expected, event_id
    assert batched.rewards() == alone.rewards()
    assert batched.rewards() == [
        ("clash", 1.0, 0, False),
        ("consumed", 1.0, 1, True),
        ("dup", 1.0, 2, False),
        ("new", 0.5, 0, False),
        ("old", -1.0, 0, True),
        ("twice-diff", 0.25, 0, False),
        ("twice-same", 0.25, 1, False),
    ]


def test_reward_batch_keeps_the_first_value_for_a_post_that_asks_it(
    worlds: tuple[World, World],
) -> None:
    world, _ = worlds
    posts = [  # the Personalizer-compatible facade's posts: another value is ignored
        RewardPost("clash", 2.0, keep_first=True),  # rewarded 1.0 before
        RewardPost("new", 0.5, keep_first=True),
        RewardPost("new", -0.5, keep_first=True),  # the post just before wins
        RewardPost("new", 0.5, keep_first=True),  # a plain duplicate
        RewardPost("twice-diff", 0.25),
        RewardPost("twice-diff", 0.75),  # without keep_first: still a conflict
    ]
    results = RewardBatch(world.sessions, WINDOW)(posts)
    seen = [
        type(r) if isinstance(r, Exception) else (r.value, r.duplicate, r.ignored) for r in results
    ]
    assert seen == [
        (1.0, True, True),
        (0.5, False, False),
        (0.5, True, True),
        (0.5, True, False),
        (0.25, False, False),
        Conflict,
    ]
    stored = {event_id: (value, repeats) for event_id, value, repeats, _ in world.rewards()}
    assert (stored["clash"], stored["new"], stored["twice-diff"]) == ((1.0, 1), (0.5, 2), (0.25, 0))


def _fail_on(engine: Engine, prefix: str) -> None:
    """Every statement starting with `prefix` fails as on a full disk."""

    def full(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith(prefix):
            error = sqlite3.OperationalError("database or disk is full")
            error.sqlite_errorname = "SQLITE_FULL"
            raise error

    event.listen(engine, "before_cursor_execute", full)


@pytest.mark.anyio
async def test_reward_batch_database_failure_fails_every_post_and_stores_nothing(
    worlds: tuple[World, World],
) -> None:
    world, _ = worlds
    before = world.rewards()
    _fail_on(world.engine, "UPDATE REWARDS")  # the batch's last statement: after its insert
    batcher = MicroBatcher(RewardBatch(world.sessions, WINDOW), max_size=8, max_wait_s=1.0)
    posts = [RewardPost("new", 0.5), RewardPost("dup", 1.0), RewardPost("unknown", 1.0)]
    with anyio.fail_after(30):
        results = await asyncio.gather(
            *(batcher.submit(post) for post in posts), return_exceptions=True
        )
        await batcher.aclose()
    assert all(isinstance(r, Unavailable) for r in results), results
    assert {r.cause for r in results if isinstance(r, Unavailable)} == {"disk_full"}
    assert world.rewards() == before


# Through the HTTP app --------------------------------------------------------------------


def _samples(metrics: str, name: str) -> dict[str, float]:
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name.startswith(name)
    }


@pytest.mark.anyio
async def test_service_concurrent_rewards_share_one_transaction(
    sqlite_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first reward's write is held; the six posted meanwhile queue behind it and are
    stored together, each with its own status, in submission order."""
    settings = sqlite_settings.model_copy(
        update={"checkpoint_poll_seconds": 600, "arm_refresh_seconds": 600}
    )
    entered, release = threading.Event(), threading.Event()
    attach = reward_rows.attach_rewards

    def held(sessions: SessionFactory, posts: list[RewardPost], *args: Any) -> list[Stored]:
        if not entered.is_set():
            entered.set()
            release.wait(30)
        return attach(sessions, posts, *args)

    async with app_client(settings) as (client, app):
        for event_id in ("a", "b", "c"):
            body = {"context": [0.0] * 4, "event_id": event_id}
            assert (await client.post("/v1/select", json=body)).status_code == 200
        batcher, submitted = app.state.runtime.reward_batcher, []
        submit = batcher.submit

        async def counting(post: RewardPost) -> Stored:
            submitted.append(post)
            return await submit(post)

        monkeypatch.setattr(batcher, "submit", counting)
        monkeypatch.setattr(reward_rows, "attach_rewards", held)
        tx = Transactions(app.state.runtime.engine)
        posts = [("a", 1.0), ("b", 0.5), ("b", 0.5), ("b", 0.7), ("a", 1.0), ("nope", 1.0)]
        posts.append(("c", 2.0))
        with anyio.fail_after(30):
            first = asyncio.ensure_future(_post(client, *posts[0]))
            await eventually(entered.is_set)
            rest = [asyncio.ensure_future(_post(client, *post)) for post in posts[1:]]
            await eventually(lambda: len(submitted) == len(posts))
            release.set()
            answers = [await first, *await asyncio.gather(*rest)]
        metrics = (await client.get("/metrics")).text
    assert [(p.event_id, p.value) for p in submitted] == posts
    assert [a.status_code for a in answers] == [200, 200, 200, 409, 200, 404, 200]
    assert [a.json().get("duplicate") for a in answers] == [
        False, False, True, None, True, None, False,
    ]  # fmt: skip
    assert tx.commits == 2  # the held batch of one, then the six together
    sizes = _samples(metrics, "rofu_reward_batch_size")
    assert (sizes["rofu_reward_batch_size_count[]"], sizes["rofu_reward_batch_size_sum[]"]) == (
        2.0,
        7.0,
    )
    assert sizes["rofu_reward_batch_size_bucket[('le', '4.0')]"] == 1.0  # the six: one batch
    outcomes = _samples(metrics, "rofu_rewards_total")
    assert {key.split("'")[3]: value for key, value in outcomes.items()} == {
        "accepted": 3.0,
        "duplicate": 2.0,
        "conflict": 1.0,
        "unknown_event": 1.0,
    }


async def _post(client: Any, event_id: str, value: float) -> Any:
    return await client.post("/v1/reward", json={"event_id": event_id, "value": value})
