"""`rofu bench stability` on a short synthetic run: a row per checkpoint with rho, the
step and both estimators' bonuses at the same weights; a cap shows in the step; a policy
that is not ROFU is refused by name."""

from __future__ import annotations

import json

import pytest

from rofu.bench import stability


def test_bench_stability_records_rho_and_both_estimators_at_each_checkpoint(tmp_path, capsys):
    out = tmp_path / "stability.json"
    argv = ["--dataset", "mlp", "--rounds", "90", "--every", "30", "--contexts", "4"]
    assert stability.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["command"] == "rofu bench stability " + " ".join([*argv, "--json", str(out)])
    rounds = [row["round"] for row in result["checkpoints"]]
    assert rounds == [30, 60, 90]
    for row in result["checkpoints"]:
        assert row["rho"] > 0
        assert row["step"] == result["config"]["params"]["step_size"]  # no cap: unchanged
        assert row["ntk_bonus_mean"] >= 0
        assert row["exact_bonus_mean"] >= 0
    assert len(result["chosen_bonus_by_tenth"]) == 10
    assert "rho" in capsys.readouterr().out


def test_bench_stability_shows_the_capped_step(tmp_path):
    out = tmp_path / "capped.json"
    argv = ["--dataset", "mlp", "--policy", "ROFU@cap=0.001", "--rounds", "60", "--every", "30"]
    assert stability.main([*argv, "--contexts", "0", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["checkpoints"]
    assert all(row["rho"] > 0.001 for row in rows)
    for row in rows:
        assert row["step"] == pytest.approx(0.01 * 0.001 / row["rho"])  # cut to rho = cap
        assert "ntk_bonus_mean" not in row


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "mlp", "--policy", "Greedy", "--rounds", "20"], "is not a ROFU policy"),
        (["--dataset", "nope"], "nope"),
        (["--dataset", "mlp", "--every", "0"], "--every must be >= 1"),
    ],
)
def test_bench_stability_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        stability.main(argv)
    assert exited.value.code != 0
    captured = capsys.readouterr()
    assert message in captured.err + str(exited.value.code)
