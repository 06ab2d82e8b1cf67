"""`rofu bench kernel` on a tiny workload: every contender runs and the JSON has its keys."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch

from rofu.bench import kernel, kernel_report
from rofu.bench.load import server_overrides
from rofu.models.presets import PRODUCT
from rofu.service.settings import Settings

TINY = kernel.Workload(context_dim=4, n_arms=3, hidden=(8,), steps=3, minibatch=16, n_data=120)


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
def test_bench_kernel_report_has_every_contender_ratio_and_share(device):
    result = kernel.report(TINY, torch.device(device), repeats=1)
    json.dumps(result)  # what --json writes
    assert result["matmul_gflops"] > 0
    assert set(result["contexts"]) == {"1", "32"}
    graphs = {"rofu_exact_graphs"} if device == "cuda" else set()  # CUDA graphs: a GPU only
    for row in result["contexts"].values():
        for name in (
            set(kernel_report.CONTENDERS + kernel_report.SERVED) - {"rofu_exact_graphs"} | graphs
        ):
            assert row[f"{name}_ms"] > 0
        assert row["ratios"]["served_over_greedy"] > 0
        assert ("rofu_exact_graphs_ms" in row) == bool(graphs)
        assert (
            set(row["share_of_matmul"])
            == {
                "rofu_reference",
                "rofu_reference_chunked",
                "rofu_exact",
                "rofu_exact_chunk256",
                "rofu_ntk",
                "ntk_prepare",
                "served",  # the product's estimator is ntk, whose FLOPs are counted
            }
            | graphs
        )
        assert all(v > 0 for v in row["flop_floor_ms"].values())
        assert ("exact_over_graphs" in row["ratios"]) == bool(graphs)
    for baseline in ("start", "drift"):
        near = result["closeness"][baseline]
        assert 0.0 <= near["same_choice_share"] <= 1.0
    assert result["served"]["estimator"] == PRODUCT.rofu.estimator
    text = kernel_report.format_report(result)
    assert text.index("served ") < text.index("other configurations") < text.index("rofu_ntk")
    assert "reference/exact" in text
    assert "exact at 256/exact" in text
    assert ("exact/graphs" in text) == bool(graphs)
    assert ("rofu_exact_graphs" in text) == bool(graphs)


def test_bench_kernel_flop_counts_order_the_estimators():
    work = kernel.Workload()
    assert work.ntk_flops(1) < work.exact_flops(10) / 20
    assert work.ntk_flops(32) < work.exact_flops(320) / 40
    assert work.exact_flops(10) == pytest.approx(0.94e9, rel=0.05)  # about 1 GFLOP a decision


def test_bench_kernel_refuses_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        kernel.main(["--repeats", "0"])
    assert "--repeats must be >= 1" in capsys.readouterr().err


def test_bench_kernel_serves_the_product_preset_as_the_load_benchmark_does():
    work = kernel.Workload()
    served = work.served_config()
    assert served == dataclasses.replace(
        PRODUCT.rofu, steps=work.steps, minibatch_size=work.minibatch
    )
    overrides = server_overrides(
        argparse.Namespace(
            n_data=20_000, trainer=False, torch_threads=None, estimator=PRODUCT.rofu.estimator
        ),
        "sqlite://",
    )
    settings = Settings(_env_file=None, **overrides)
    assert settings.rofu_config() == served
