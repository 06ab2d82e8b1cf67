"""`rofu evaluate` on Postgres, on a simulated app whose reward rule is known: the
service serves it with an exploration floor of 0.2, the real trainer makes checkpoints,
and each checkpoint's policies are estimated on the decisions it has not seen. Their
95% intervals cover the true values of those policies on those decisions."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rofu import cli
from rofu.service.settings import Settings, get_settings
from tests.simulated_app import ARMS, DIM, KnownApp, Logged, greedy, served, service_settings, train
from tests.simulated_app import uniform as uniform_policy

PHASES = (200, 300, 600)  # cold start (v0), then served by v1, then by v2
FLOOR = 0.2


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch, pg_clean: str) -> Iterator[str]:
    """The evaluating shell's ROFU_* settings: the service's database and network, but
    exploration floor 0 (the service runs with 0.2)."""
    for name in list(os.environ):
        if name.upper().startswith("ROFU_"):
            monkeypatch.delenv(name)
    env = {
        "ROFU_DATABASE_URL": pg_clean,
        "ROFU_CONTEXT_DIM": str(DIM),
        "ROFU_HIDDEN": "[]",
        "ROFU_MAX_ARMS": str(len(ARMS)),
        "ROFU_EMBEDDED_TRAINER": "false",
        "ROFU_EXPLORATION_FLOOR": "0",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield pg_clean
    get_settings.cache_clear()


def _covers(estimate: dict[str, Any], truth: float) -> bool:
    return bool(estimate["ci_low"] <= truth <= estimate["ci_high"])


def _evaluate(out: Path, *args: str) -> dict[str, Any]:
    assert cli.main(["evaluate", "--out", str(out), "--floors", "0.05", *args]) == 0
    figures: dict[str, Any] = json.loads((out / "evaluate.json").read_text())
    return figures


def _floor(rows: list[Logged], floor: float) -> np.ndarray:
    """(N, A) the served rule with another floor: the logged rule mixes the argmax of the
    bonus-raised value with the uniform choice at FLOOR, so its argmax is the most
    probable candidate."""
    top = np.eye(len(ARMS))[served(rows).argmax(axis=1)]
    return (1 - floor) * top + floor * uniform_policy(rows)


@pytest.mark.anyio
async def test_evaluate_covers_the_true_values_on_the_rows_each_checkpoint_has_not_seen(
    shell: str, tmp_path: Path
) -> None:
    settings: Settings = service_settings(shell, exploration_floor=FLOOR)
    app = KnownApp(seed=21)
    cold = await app.serve(settings, "p0", PHASES[0])
    assert train(settings) == 1  # consumes the cold start
    by_v1 = await app.serve(settings, "p1", PHASES[1])
    assert train(settings) == 2  # consumes phase 1
    by_v2 = await app.serve(settings, "p2", PHASES[2])
    assert {row.version for row in by_v1} == {1}
    assert {row.version for row in by_v2} == {2}
    assert min(p for row in by_v2 for p in row.probabilities.values()) > 0  # the floor

    figures = _evaluate(tmp_path / "fresh")
    policies = figures["policies"]
    truth = {
        "served v2": app.value(by_v2, served(by_v2)),
        "greedy v2": app.value(by_v2, greedy(by_v2)),
        "served v2, floor 0.05": app.value(by_v2, _floor(by_v2, 0.05)),
        "uniform": app.value(by_v2, uniform_policy(by_v2)),
    }
    for name, value in truth.items():
        result = policies[name]
        assert (result["rows"], result["fitted_on"]) == (PHASES[2], 0), name
        assert result["support"] == pytest.approx(1.0)
        for estimator in ("ips", "snips", "dr"):
            assert _covers(result[estimator], value), (name, estimator, result[estimator], value)
    assert truth["greedy v2"] > truth["uniform"] + 0.5  # v2 learned something
    assert _covers(figures["logged"], truth["served v2"])  # served v2 is the logging policy
    assert figures["reference"]["rows"] == PHASES[2]
    assert policies["checkpoint v1"]["rows"] == PHASES[1] + PHASES[2]  # phase 1: v2's, not v1's

    # scored under the recorded configuration (floor 0.2), not the shell's floor 0: the
    # probabilities are the ones the service logged
    assert figures["served"]["config"]["exploration_floor"] == FLOOR
    assert figures["served"]["config"]["source"] == "checkpoint"
    assert figures["served"]["mismatch"]["rows"] == PHASES[2]
    assert figures["served"]["mismatch"]["total_variation"] < 1e-6
    assert policies["served v2"]["note"].startswith("argmax, floor 0.2, bonus x1")
    assert "served v2, floor 0.2" not in policies  # the served floor is the served row

    figures = _evaluate(tmp_path / "all", "--include-training-rows")
    total = sum(PHASES)
    first = (tmp_path / "all" / "evaluate.md").read_text().splitlines()[0]
    assert first.startswith("**Optimistic")
    assert f"fitted on {PHASES[0] + PHASES[1]} of these {total} rows" in first
    assert figures["optimistic"] in first
    assert figures["policies"]["served v2"]["rows"] == total
    assert figures["policies"]["served v2"]["fitted_on"] == PHASES[0] + PHASES[1]
    assert len(cold) == PHASES[0]
