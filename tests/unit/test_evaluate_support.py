"""What an argmax log supports: checkpoint 1 serves by argmax (probabilities 1 and 0),
checkpoint 2 is a better model. Only checkpoint 1's own rule has its choices on the log's
support; every other policy's IPS, SNIPS and DR are refused, its DM still given."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rofu import cli
from rofu.evaluation.estimates import MIN_SUPPORT
from rofu.service import migrate
from rofu.service.db import repository
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.settings import Settings
from tests.simulated_app import ARMS, KnownApp
from tests.unit.test_evaluate import _known_model, _store, linear_environment

SAMPLE = [{"context": [0.1 * i, -0.2, 0.3, 0.0], "arm": ARMS[i % 4]} for i in range(16)]
REFUSED = ("uniform", "greedy v2", "served v2", "served v2, floor 0.05", "served v2, bonus x2")


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Settings]:
    """A linear network on 4 arms serving by argmax without a bonus: a 0/1 log."""
    yield from linear_environment(
        monkeypatch,
        tmp_path,
        ROFU_MAX_ARMS="4",
        ROFU_BONUS_SCALE="0",
        ROFU_EXPLORATION_FLOOR="0",
        ROFU_REWARD_WINDOW_SECONDS="0",
    )


def _pin(settings: Settings, version: int | None) -> None:
    engine = make_engine(settings.database_url)
    try:
        repository.set_pin(session_factory(engine), version)
    finally:
        engine.dispose()


@pytest.mark.anyio
async def test_evaluate_refuses_ips_snips_and_dr_off_an_argmax_logs_support(
    environment: Settings, tmp_path: Path
) -> None:
    settings, app = environment, KnownApp(seed=5)
    migrate.upgrade(settings.database_url)
    _store(settings, 1, _known_model(settings, KnownApp(seed=6)), SAMPLE)  # another world's
    _store(settings, 2, _known_model(settings, app), SAMPLE)  # this world's true means
    _pin(settings, 1)
    logged = await app.serve(settings, "argmax", 300)
    _pin(settings, None)  # v2 is served now
    assert {row.version for row in logged} == {1}
    assert {p for row in logged for p in row.probabilities.values()} == {0.0, 1.0}

    out = tmp_path / "report"
    assert cli.main(["evaluate", "--out", str(out), "--floors", "0.05"]) == 0
    figures = json.loads((out / "evaluate.json").read_text())
    policies, report = figures["policies"], (out / "evaluate.md").read_text()
    on_support = np.mean([1 / len(row.candidates) for row in logged])  # the logged arm's share
    assert policies["uniform"]["support"] == pytest.approx(on_support)
    for name in REFUSED:
        result = policies[name]
        assert result["rows"] == 300, name
        assert result["support"] < MIN_SUPPORT, name
        assert (result["ips"], result["snips"], result["dr"]) == (None, None, None), name
        assert result["dm"]["value"] is not None, name
        refusal = f"not supported ({result['support']:.1%} of its choices on the log's support)"
        assert result["refused"] == refusal
        assert f"| {name} | 300 |" in report
        assert refusal in report
    own = policies["checkpoint v1"]  # the logging rule itself: all on the support
    assert own["support"] == 1.0
    assert own["refused"] is None
    assert own["rows"] == 300
    assert own["ips"]["value"] == pytest.approx(figures["logged"]["value"])  # on-policy
    assert "| DM, reward model |" in report

    assert cli.main(["evaluate", "--out", str(out), "--min-support", "0"]) == 0
    policies = json.loads((out / "evaluate.json").read_text())["policies"]
    assert policies["uniform"]["refused"] is None
    assert policies["uniform"]["ips"]["value"] is not None
