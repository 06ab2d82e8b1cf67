"""`rofu bench bonus` on a short synthetic run: every form's shape and cost on one model; a
pure count bonus reads as one; a bad argument is a usage error."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rofu.bench import bonus


def test_bench_bonus_compares_every_form_on_one_model(tmp_path, capsys):
    out = tmp_path / "bonus.json"
    argv = ["--datasets", "mlp", "--rounds", "80", "--contexts", "24", "--closed-rows", "16,64"]
    assert bonus.main([*argv, "--repeats", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    entry = result["datasets"]["mlp"]
    assert set(entry["forms"]) == {"ntk", "closed@16", "closed@64", "kfac"}
    assert entry["rows"] == 80
    for form, row in entry["forms"].items():
        assert row["bonus_mean"] > 0, form
        assert row["within_arm_p90_p10_median"] >= 1.0, form
        assert row["prepare_ms"] > 0, form
        assert row["decision_ms"] > 0, form
        assert (row["span_share"] is None) == (not form.startswith("closed")), form
    small, large = (
        entry["forms"]["closed@16"]["span_share"],
        entry["forms"]["closed@64"]["span_share"],
    )
    assert 0.0 < small < large <= 1.0  # more rows span more of a query's gradient
    assert result["matmul_gflops"] > 0
    assert "closed@64" in capsys.readouterr().out


def test_bench_bonus_reads_a_count_bonus_as_one():
    counts = np.array([3.0, 15.0, 99.0])
    count_bonus = np.tile(2.0 / np.sqrt(counts + 1), (50, 1))  # (contexts, arms), context-blind
    figures = bonus.shape(count_bonus, counts)
    assert figures["within_arm_p90_p10_median"] == pytest.approx(1.0)
    assert figures["count_bonus_max_over_min"] == pytest.approx(1.0)
    aware = count_bonus * np.linspace(0.5, 2.0, 50)[:, None]
    assert bonus.shape(aware, counts)["within_arm_p90_p10_median"] > 2.0


@pytest.mark.parametrize(
    "argv", [["--datasets", "nope"], ["--closed-rows", "a,b"]], ids=["data set", "rows"]
)
def test_bench_bonus_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bonus.main(argv)
    assert exit_info.value.code == 2
    assert "rofu bench bonus" in capsys.readouterr().err
