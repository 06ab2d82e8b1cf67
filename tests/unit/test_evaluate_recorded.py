"""`rofu evaluate` scores each checkpoint under the configuration it recorded: a service
running with exploration floor 0.2 is reported (and its policy scored) as floor 0.2 from a
shell whose settings say floor 0. A checkpoint made before the record existed falls back
to the shell's settings, and the report says so; rows that logged only the chosen arm's
propensity leave the support unknown."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from rofu import cli
from rofu.models import RewardNet
from rofu.service import migrate
from rofu.service.db.engine import make_engine
from rofu.service.db.tables import DecisionRow
from rofu.service.settings import Settings
from tests.simulated_app import ARMS, KnownApp, served, service_settings, train
from tests.unit.test_evaluate import _store, linear_environment

SAMPLE = [{"context": [0.1 * i, -0.2, 0.3, 0.0], "arm": ARMS[i % 4]} for i in range(16)]


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Settings]:
    """The evaluating shell: the service's network and database, exploration floor 0."""
    yield from linear_environment(
        monkeypatch, tmp_path, ROFU_MAX_ARMS=str(len(ARMS)), ROFU_EXPLORATION_FLOOR="0"
    )


def _forget_probabilities(settings: Settings) -> None:
    """Make every decision look logged before 0004: its chosen arm's propensity alone."""
    engine = make_engine(settings.database_url)
    try:
        with engine.begin() as connection:
            connection.execute(update(DecisionRow).values(probabilities=None))
    finally:
        engine.dispose()


@pytest.mark.anyio
async def test_evaluate_reports_the_floor_the_service_ran_with_not_the_shells(
    shell: Settings, tmp_path: Path
) -> None:
    migrate.upgrade(shell.database_url)
    service = service_settings(shell.database_url, exploration_floor=0.2)
    _store(shell, 1, RewardNet(shell.net_config()), SAMPLE)  # made before records existed
    app = KnownApp(seed=9)
    await app.serve(service, "v1", 150)
    assert train(service) == 2  # the trainer records the service's configuration
    by_v2 = await app.serve(service, "v2", 300)
    assert min(served(by_v2)[served(by_v2) > 0]) == pytest.approx(0.2 / 4)  # floor / K

    out = tmp_path / "report"
    assert cli.main(["evaluate", "--out", str(out)]) == 0
    figures = json.loads((out / "evaluate.json").read_text())
    report = (out / "evaluate.md").read_text()
    policies = figures["policies"]
    assert figures["served"]["config"]["exploration_floor"] == 0.2
    assert figures["served"]["config"]["source"] == "checkpoint"
    assert figures["served"]["mismatch"] == {"rows": 300, "total_variation": 0.0}
    assert policies["served v2"]["note"] == "argmax, floor 0.2, bonus x1 (ntk), as v2 recorded"
    assert "scored under the configuration it recorded: argmax, floor 0.2, bonus x1" in report
    assert "served v2, floor 0.05" in policies
    assert "served v2, floor 0.2" not in policies  # that is the served row itself

    old = policies["checkpoint v1"]  # all 450 rows: the first 150 were consumed by v2
    assert (old["rows"], old["fitted_on"]) == (450, 0)
    assert old["config"]["source"] == "settings"
    assert old["config"]["exploration_floor"] == 0.0
    assert (
        old["note"] == "argmax, floor 0, bonus x1 (ntk), this shell's settings (v1 recorded none)"
    )
    note = "checkpoint v1 records no serving configuration: scored with this shell's settings"
    assert any(line.startswith(note) for line in figures["notes"])
    assert f"- {note}" in report

    _forget_probabilities(service)
    assert cli.main(["evaluate", "--out", str(out)]) == 0
    figures = json.loads((out / "evaluate.json").read_text())
    result = figures["policies"]["greedy v2"]
    assert (result["support"], result["support_rows"], result["refused"]) == (None, 0, None)
    assert result["ips"]["value"] is not None  # not refused, but not vouched for
    assert figures["served"]["mismatch"] is None  # nothing logged to compare with
    assert "| greedy v2 | 300 |" in (out / "evaluate.md").read_text()
    assert "| unknown |" in (out / "evaluate.md").read_text()
