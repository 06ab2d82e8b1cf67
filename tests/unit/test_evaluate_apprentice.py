"""`rofu evaluate` on an apprentice log: the service serves an app's baseline (a fixed,
mediocre rule) on a simulated linear bandit whose values are known, first at a cold
start, then with the true model as checkpoint 1. The report's baseline section must
cover the true values and differences, on the rows decided after checkpoint 1 for its
policies and on every row for rofu's rule as logged, and say that rofu's policy beats
the baseline; in the main table, where only the baseline's arm has a logged reward,
IPS, SNIPS and DR of the other policies are refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rofu import cli
from rofu.evaluation.baseline import AS_LOGGED, BEATS
from rofu.service import migrate
from rofu.service.settings import Settings
from tests.support import app_client
from tests.unit.test_evaluate import (
    ARMS,
    LinearBandit,
    _covers,
    _known_model,
    _store,
    linear_environment,
)

ROUNDS = 600  # per phase: cold start (v0), then checkpoint 1 (the true model)


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Settings]:
    """Apprentice mode, a linear network without bonus (rofu's rule: its argmax mean)."""
    yield from linear_environment(
        monkeypatch,
        tmp_path,
        ROFU_LEARNING_MODE="apprentice",
        ROFU_BONUS_SCALE="0",
        ROFU_EXPLORATION_FLOOR="0",  # rofu's own rule: the argmax alone
    )


class Baseline:
    """The app's own rule: the argmax of a fixed random linear score (every arm wins
    somewhere, few of them where they should)."""

    def __init__(self, seed: int) -> None:
        self.weights = np.random.default_rng(seed).normal(size=(len(ARMS), 4))  # (A, D)

    def choose(self, x: np.ndarray) -> np.ndarray:
        """(N, D) -> (N,) arm indices."""
        chosen: np.ndarray = (x @ self.weights.T).argmax(axis=1)
        return chosen


async def _log(
    settings: Settings, bandit: LinearBandit, baseline: Baseline, phase: int, version: int
) -> list[dict[str, Any]]:
    contexts = bandit.rng.normal(size=(ROUNDS, 4)).round(6)
    noise = bandit.rng.normal(size=ROUNDS)
    chosen = baseline.choose(contexts)
    logged: list[dict[str, Any]] = []
    async with app_client(settings) as (client, _):

        async def one(i: int) -> None:
            body = {
                "context": contexts[i].tolist(),
                "event_id": f"p{phase}-{i:05d}",
                "baseline_arm": ARMS[chosen[i]],
            }
            decision = (await client.post("/v1/select", json=body)).json()
            assert decision["arm"] == body["baseline_arm"]
            assert decision["model_version"] == version
            value = bandit.reward(body["context"], decision["arm"], noise[i])
            reward = {"event_id": decision["event_id"], "value": value}
            assert (await client.post("/v1/reward", json=reward)).status_code == 200
            logged.append({**body, "arm": decision["arm"], "rofu_arm": decision["rofu_arm"]})

        for start in range(0, ROUNDS, 50):
            await asyncio.gather(*(one(i) for i in range(start, min(start + 50, ROUNDS))))
    return sorted(logged, key=lambda row: row["event_id"])


@pytest.mark.anyio
async def test_evaluate_compares_rofu_with_the_apprentice_baseline(
    environment: Settings, tmp_path: Path
) -> None:
    settings, bandit, baseline = environment, LinearBandit(seed=3), Baseline(seed=11)
    migrate.upgrade(settings.database_url)
    cold = await _log(settings, bandit, baseline, phase=0, version=0)
    _store(settings, 1, _known_model(settings, bandit), cold)
    served = await _log(settings, bandit, baseline, phase=1, version=1)
    assert cli.main(["evaluate", "--out", str(tmp_path)]) == 0
    figures = json.loads((tmp_path / "evaluate.json").read_text())
    section = figures["baseline"]

    rows = cold + served
    x = np.array([row["context"] for row in rows])
    means = bandit.means(x)  # (N, A)
    b = np.array([ARMS.index(row["baseline_arm"]) for row in rows])
    at_baseline = means[np.arange(len(rows)), b]
    best, uniform = means.max(axis=1), means.mean(axis=1)
    fresh = slice(ROUNDS, None)  # decided after checkpoint 1 was stored
    assert section["rows"] == section["served"] == ROUNDS
    assert _covers(section["value"], at_baseline[fresh].mean())
    assert at_baseline.mean() < best.mean() - 0.5  # the baseline is mediocre

    greedy = section["policies"]["greedy v1"]  # the true model's argmax
    assert greedy["rows"] == ROUNDS
    assert _covers(greedy["value"], best[fresh].mean())
    assert _covers(greedy["difference"], (best - at_baseline)[fresh].mean())
    assert greedy["verdict"] == BEATS
    low, high = greedy["bounds"]
    assert low <= best[fresh].mean() <= high  # no reward model: only bounds, wide ones
    assert high - low > 1.0
    difference = (uniform - at_baseline)[fresh].mean()
    assert _covers(section["policies"]["uniform"]["difference"], difference)
    main = figures["policies"]["greedy v1"]  # the log holds the baseline's arm alone
    assert main["support"] == pytest.approx(greedy["agreement"])
    assert main["support"] < 0.95
    assert (main["ips"], main["snips"], main["dr"]) == (None, None, None)
    assert _covers(main["dm"], best[fresh].mean())

    # rofu as logged: uniform at the cold start (v0), then the true model's argmax (v1)
    as_logged = np.concatenate([uniform[:ROUNDS], best[ROUNDS:]])
    assert section["policies"][AS_LOGGED]["rows"] == 2 * ROUNDS
    assert _covers(section["policies"][AS_LOGGED]["value"], as_logged.mean())
    v0, v1 = section["by_version"]["0"], section["by_version"]["1"]
    assert (v0["rows"], v1["rows"]) == (ROUNDS, ROUNDS)
    truth_v0 = (uniform - at_baseline)[:ROUNDS].mean()
    truth_v1 = (best - at_baseline)[ROUNDS:].mean()
    assert _covers(v0["difference"], truth_v0)
    assert _covers(v1["difference"], truth_v1)
    assert v1["verdict"] == BEATS
    assert {row["rofu_arm"] for row in served} <= set(ARMS)
    chosen_by_rofu = np.array([ARMS.index(row["rofu_arm"]) for row in served])
    assert (chosen_by_rofu == means[ROUNDS:].argmax(axis=1)).all()

    report = (tmp_path / "evaluate.md").read_text()
    assert "## rofu against the app's baseline" in report
    assert f"| v1 | {ROUNDS} |" in report
    assert BEATS in report
    assert "rofu's own rule beat the baseline on the rows of v0, v1." in report
