"""The decision log on Postgres: keyset pages over equal times, and `rofu export`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from rofu.service.db import arms as arm_rows
from rofu.service.db import repository
from rofu.service.db import rewards as reward_rows
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.db.tables import DecisionRow
from rofu.service.log.export import export
from rofu.service.log.pages import Window, iter_decisions, position
from rofu.service.settings import Settings

ARMS = ["arm-0", "arm-1", "arm-2", "arm-3"]
START = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def _decisions() -> list[DecisionRow]:
    return [  # three share each time: the event id orders them
        DecisionRow(
            event_id=f"pg-{(5 * i) % 11:02d}",
            created_at=START + timedelta(milliseconds=i // 3),
            context=[0.5, -1.0, float(i), 2.0],
            candidates=ARMS,
            arm_id=ARMS[i % 4],
            slot=i % 4,
            propensity=0.25,
            model_version=0,
            explore=True,
            policy="cold-start",
            scores=[],
            request_hash="",
        )
        for i in range(11)
    ]


def test_export_pages_and_formats_on_postgres(pg_clean: str, tmp_path: Path) -> None:
    engine = make_engine(pg_clean)
    sessions = session_factory(engine)
    try:
        rows = _decisions()
        arm_rows.ensure_arms(sessions, [(arm, None) for arm in ARMS], max_arms=8)
        repository.insert_decisions(sessions, rows)
        for row in rows[::2]:
            reward_rows.attach_reward(sessions, row.event_id, float(row.slot))
        read = list(iter_decisions(sessions, page_size=3))
        window = Window(START + timedelta(milliseconds=1), START + timedelta(milliseconds=3))
        middle = list(iter_decisions(sessions, window, page_size=2))
    finally:
        engine.dispose()
    expected = sorted((row.created_at, row.event_id) for row in rows)
    assert [position(record) for record in read] == expected
    assert [position(record) for record in middle] == expected[3:9]
    rewarded = {row.event_id: float(row.slot) for row in rows[::2]}
    assert {r.event_id: r.reward for r in read if r.reward is not None} == rewarded
    assert all(r.late is False for r in read if r.reward is not None)

    settings = Settings(database_url=pg_clean, context_dim=4)
    dsjson, npz = tmp_path / "log.dsjson", tmp_path / "log.npz"
    assert export(settings, "dsjson", Window(), dsjson) == 11
    events = [json.loads(line) for line in dsjson.read_text().splitlines()]
    assert [e["EventId"] for e in events] == [event_id for _, event_id in expected]
    assert sum("_label_cost" in e for e in events) == len(rewarded)
    assert export(settings, "obp", Window(), npz) == len(rewarded)
    with np.load(npz) as feedback:
        assert feedback["context"].shape == (len(rewarded), 4)
        np.testing.assert_allclose(feedback["pscore"], 0.25)
