"""The decision log read back: keyset pages, GET /v1/decisions, and `rofu export` as VW
DSJSON (parsed by VW's own reader), Open Bandit Pipeline arrays and Parquet."""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import SecretStr
from sqlalchemy import event

from rofu import cli
from rofu.client.records import DecisionRecord
from rofu.service.db import repository
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.db.tables import DecisionRow
from rofu.service.log.export import export
from rofu.service.log.pages import EVERYTHING, Window, iter_decisions, position, read_page
from rofu.service.settings import Settings, get_settings
from tests.support import app_client, seed_checkpoint

ARMS = ["arm-0", "arm-1", "arm-2", "arm-3"]
ADMIN = "admin-key-bbbbbbbbbbbbbbbbbb"
CLIENT = "client-key-aaaaaaaaaaaaaaaa"
# What OBP's estimators read from a bandit feedback dict (obp.dataset.OpenBanditDataset).
OBP_KEYS = {"n_rounds", "n_actions", "action", "reward", "pscore", "context", "position"}


def _context(i: int) -> list[float]:
    return [0.25 + 0.1 * i, -0.5, 1.0 - 0.05 * i, 0.75]  # no zero: VW drops zero features


async def _serve(settings: Settings, first: int, count: int) -> None:
    """`count` decisions through the API; every other one rewarded, some on subsets."""
    async with app_client(settings) as (client, _):
        for i in range(first, first + count):
            body: dict[str, Any] = {"context": _context(i), "event_id": f"event-{i:02d}"}
            if i % 3 == 1:
                body["arms"] = ["arm-2", "arm-0", "arm-3"]
            if i % 4 == 3:
                body["explore"] = False
            decision = await client.post("/v1/select", json=body)
            assert decision.status_code == 200, decision.text
            if i % 2 == 0:
                reward = {"event_id": body["event_id"], "value": 0.5 * i - 2.0}
                assert (await client.post("/v1/reward", json=reward)).status_code == 200


@pytest.fixture
async def logged(sqlite_settings: Settings) -> Settings:
    """Six cold-start decisions, then six by a seeded model (ROFU scores)."""
    await _serve(sqlite_settings, 0, 6)
    seed_checkpoint(sqlite_settings, n_rows=50)
    await _serve(sqlite_settings, 6, 6)
    return sqlite_settings


def _records(settings: Settings, window: Window = EVERYTHING) -> list[DecisionRecord]:
    engine = make_engine(settings.database_url)
    try:
        return list(iter_decisions(session_factory(engine), window, page_size=5))
    finally:
        engine.dispose()


def test_decision_log_pages_by_time_then_event_id(sqlite_settings: Settings) -> None:
    from rofu.service import migrate

    migrate.upgrade(sqlite_settings.database_url)
    engine = make_engine(sqlite_settings.database_url)
    sessions = session_factory(engine)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [  # several share a time: the event id orders them
        DecisionRow(
            event_id=f"e{(7 * i) % 11:02d}",
            created_at=start + timedelta(seconds=i // 3),
            context=[0.1, 0.2, 0.3, 0.4],
            candidates=ARMS,
            arm_id="arm-1",
            slot=1,
            propensity=0.25,
            model_version=0,
            explore=True,
            policy="cold-start",
            scores=[],
            request_hash="",
        )
        for i in range(11)
    ]
    repository.insert_decisions(sessions, rows)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    try:
        read = list(iter_decisions(sessions, page_size=3))
        expected = sorted((r.created_at, r.event_id) for r in rows)
        assert [position(r) for r in read] == expected
        assert sum("FROM decisions" in s for s in statements) == 4  # 3 + 3 + 3 + 2: pages
        assert all("LIMIT" in s for s in statements if "FROM decisions" in s)
        window = Window(start + timedelta(seconds=1), start + timedelta(seconds=3))
        assert [position(r) for r in read_page(sessions, window, None, 100)] == expected[3:9]
        assert read[0].probabilities == [0.25] * 4  # a cold start is uniform
    finally:
        engine.dispose()


@pytest.mark.anyio
async def test_decisions_endpoint_pages_the_log_with_an_opaque_cursor(logged: Settings) -> None:
    keyed = logged.model_copy(
        update={"api_keys": [SecretStr(CLIENT)], "admin_api_keys": [SecretStr(ADMIN)]}
    )
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with app_client(keyed) as (client, _):
        client_key = {"Authorization": f"Bearer {CLIENT}"}
        assert (await client.get("/v1/decisions", headers=client_key)).status_code == 403
        assert (await client.get("/v1/decisions")).status_code == 401
        pages, url = [], "/v1/decisions?limit=5"
        while url:
            page = await client.get(url, headers=admin)
            assert page.status_code == 200, page.text
            pages.append(page.json())
            link = page.headers.get("link")
            url = link[1 : link.index(">")] if link else ""
        assert [len(p) for p in pages] == [5, 5, 2]
        served = [record for page in pages for record in page]
        assert [r["event_id"] for r in served] == [f"event-{i:02d}" for i in range(12)]
        exported = _records(logged)
        assert [r.event_id for r in exported] == [r["event_id"] for r in served]
        for record, row in zip(exported, served, strict=True):
            assert (row["reward"], row["arm"]) == (record.reward, record.arm)
            assert row["probabilities"] == record.probabilities
            assert datetime.fromisoformat(row["created_at"]) == record.created_at
        cold, rofu = served[0], served[-1]
        assert (cold["policy"], cold["model_version"], cold["scores"][0]["mean"]) == (
            "cold-start",
            0,
            None,
        )
        assert rofu["policy"] == "rofu"
        assert rofu["scores"][0]["mean"] is not None
        until = served[6]["created_at"]
        early = await client.get("/v1/decisions", params={"until": until}, headers=admin)
        assert [r["event_id"] for r in early.json()] == [r["event_id"] for r in served[:6]]
        nul = base64.urlsafe_b64encode(b'["2026-01-01T00:00:00+00:00", "a\\u0000b"]').decode()
        for bad in (
            *("cursor=x", "cursor=WzFd", f"cursor={nul}", "limit=0", "limit=1001"),
            *("since=x", "until=0.5", "since=2026-13-01", "until=0001-01-01T00:00:00%2B01:00"),
        ):
            refused = await client.get(f"/v1/decisions?{bad}", headers=admin)
            assert refused.status_code == 422, bad
            assert refused.json()["error"]["field"].split(".")[-1] == bad.split("=")[0]


@pytest.mark.anyio
async def test_export_dsjson_lines_parse_with_vws_own_reader(
    logged: Settings, tmp_path: Path
) -> None:
    vw = pytest.importorskip("vowpalwabbit")
    path = tmp_path / "log.dsjson"
    assert export(logged, "dsjson", Window(), path) == 12
    lines = path.read_text().splitlines()
    records = _records(logged)
    workspace = vw.Workspace("--cb_explore_adf --dsjson --quiet --strict_parse")
    for line, record in zip(lines, records, strict=True):
        event = json.loads(line)
        assert event["EventId"] == record.event_id
        assert event["a"][0] == record.chosen_index + 1
        assert sorted(event["a"]) == list(range(1, len(record.candidates) + 1))
        assert event["p"][0] == pytest.approx(record.propensity)
        assert sum(event["p"]) == pytest.approx(1.0)
        assert event["VWState"]["m"] == f"rofu/{record.model_version}"
        examples = workspace.parse(line)
        assert len(examples) == 1 + len(record.candidates)  # shared + one per candidate
        shared = examples[0]
        assert [shared.feature_weight(0, j) for j in range(shared.num_features_in(0))] == (
            pytest.approx(record.context)
        )
        labels = {
            i: [
                (c.action, c.cost, c.probability)
                for c in ex.get_label(vw.LabelType.CONTEXTUAL_BANDIT).costs
            ]
            for i, ex in enumerate(examples[1:])
        }
        if record.reward is None:
            assert not any(labels.values()), "an unrewarded event has no label"
        else:
            chosen = record.chosen_index
            ((action, cost, probability),) = labels.pop(chosen)
            assert action == chosen + 1
            assert cost == pytest.approx(-record.reward)  # VW minimises cost
            assert probability == pytest.approx(record.propensity)
            assert not any(labels.values())
        workspace.learn(examples)
        workspace.finish_example(examples)
    workspace.finish()
    assert [json.loads(line)["rofu"]["policy"] for line in lines[::6]] == ["cold-start", "rofu"]


@pytest.mark.anyio
async def test_export_obp_arrays_have_the_keys_and_shapes_obp_documents(
    logged: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "log.npz"
    assert export(logged, "obp", Window(), path) == 6  # the rewarded decisions
    with np.load(path) as archive:
        feedback = dict(archive)
    assert OBP_KEYS | {"action_context", "pi_b"} <= set(feedback)
    n, n_actions = int(feedback["n_rounds"]), int(feedback["n_actions"])
    assert (n, n_actions) == (6, 4)
    assert feedback["action"].shape == feedback["reward"].shape == feedback["pscore"].shape == (n,)
    assert feedback["context"].shape == (n, 4)
    assert feedback["position"].tolist() == [0] * n
    np.testing.assert_array_equal(feedback["action_context"], np.eye(4))
    rewarded = [r for r in _records(logged) if r.reward is not None]
    assert feedback["action"].tolist() == [r.slot for r in rewarded]
    assert feedback["reward"].tolist() == [r.reward for r in rewarded]
    np.testing.assert_allclose(feedback["context"], [r.context for r in rewarded])
    pi_b = feedback["pi_b"]
    assert pi_b.shape == (n, n_actions, 1)
    np.testing.assert_allclose(pi_b.sum(axis=1), 1.0)
    np.testing.assert_allclose(pi_b[np.arange(n), feedback["action"], 0], feedback["pscore"])
    assert export(logged, "obp", Window(), path, default_reward=0.0) == 12


@pytest.mark.anyio
async def test_export_parquet_holds_every_record(logged: Settings, tmp_path: Path) -> None:
    parquet = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "log.parquet"
    assert export(logged, "parquet", Window(), path) == 12
    table = parquet.read_table(path).to_pylist()
    records = _records(logged)
    assert [row["event_id"] for row in table] == [r.event_id for r in records]
    assert [row["reward"] for row in table] == [r.reward for r in records]
    assert [row["created_at"] for row in table] == [r.created_at for r in records]
    assert table[-1]["scores"][0]["arm"] == records[-1].candidates[0]


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, logged: Settings) -> Iterator[None]:
    for name in list(os.environ):
        if name.upper().startswith("ROFU_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ROFU_DATABASE_URL", logged.database_url)
    monkeypatch.setenv("ROFU_CONTEXT_DIM", "4")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.mark.anyio
@pytest.mark.usefixtures("environment")
async def test_rofu_export_command_writes_files_and_explains_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "log.dsjson"
    assert (
        cli.main(["export", "--format", "dsjson", "--since", "2000-01-01", "--out", str(out)]) == 0
    )
    assert len(out.read_text().splitlines()) == 12
    assert "12 decisions" in capsys.readouterr().err
    assert cli.main(["export", "--format", "dsjson", "--until", "2000-01-01"]) == 0
    assert capsys.readouterr().out == ""
    assert cli.main(["export", "--format", "obp"]) == 2
    assert "--out" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    assert cli.main(["export", "--format", "parquet", "--out", str(tmp_path / "x.parquet")]) == 2
    assert "pip install 'rofu[export]'" in capsys.readouterr().err
    assert not list(tmp_path.glob("x.parquet*"))  # nothing half-written
    with pytest.raises(SystemExit):
        cli.main(["export", "--format", "dsjson", "--since", "yesterday"])
    assert "ISO 8601" in capsys.readouterr().err
