"""ROFU kernel benchmark: the contenders timed side by side, interleaved, in one run.

At the reference workload (context dim 64, 10 arms, MLP 64-100-100-10, M = 5, regulariser
minibatch 256, |D| = 20 000) it times, for 1 and for 32 concurrent contexts:

- `naive`: the per-pair loop (`rofu.models.rofu_naive`), the definition;
- `rofu_reference`: the torch.func estimator (`kernel="functional"`), the former kernel,
  as it ran when the engine issue was filed (256 pairs a chunk);
  `rofu_reference_chunked`: the same with today's default chunks (`rofu.models.rofu.chunk_pairs`);
- `rofu_exact`: the hand-written batched exact kernel (`rofu.models.rofu_exact`), default
  chunks; `rofu_exact_chunk256`: the same kernel 256 pairs a chunk (what the chunks buy);
- `rofu_ntk`: NTK-ROFU from a prepared basis (`rofu.models.rofu_ntk`; the checkpoint's
  preparation, `rofu.models.prepared.prepare`, is timed as `ntk_prepare`);
- `rofu_exact_graphs` (CUDA only): the exact kernel replayed from the CUDA graph of its
  batch bucket (`rofu.models.rofu_graphs`), as the service scores on a GPU; captured during the
  warm-up;

every ROFU contender but `naive` is scored as the service scores, from a checkpoint prepared
once (`rofu.models.prepared`: `prepare`, then `score`);
- `served`: the headline, the product preset's estimator and selection rule (`PRODUCT`,
  whatever estimator it names) on this network, as `rofu bench load` serves it (M and the
  minibatch the workload's), prepared once as a replica prepares a checkpoint (the step
  resolved under its cap, timed as `served_prepare`), and `served_explain`, what
  `explain: true` adds (the mean's gradients, one backward pass per arm); every other ROFU
  row is another configuration, labelled as such;
- `neuralucb_diag` and `greedy` scoring on the same network;

plus a plain fp32 matrix product for the machine's rate. Repetitions are interleaved
(round robin) so that load on a shared machine hits every contender alike. Each
estimator's FLOPs are counted, so every time is also a share of the matmul rate and a
FLOP floor (the time it would take at that rate). Last, the two estimators' bonuses are
compared on a partly fitted network under both baselines.

    rofu bench kernel [--device cpu|cuda] [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rofu.bench.kernel_report import format_report
from rofu.bench.workload import Workload
from rofu.models import (
    FitConfig,
    RegulariserData,
    RewardNet,
    RewardNetConfig,
    RofuConfig,
    Scores,
    Transitions,
    fit,
)
from rofu.models.policies import NeuralUCB, NeuralUCBParams
from rofu.models.policies.base import rofu_decide
from rofu.models.prepared import PreparedModel, prepare, score
from rofu.models.rofu import rofu_scores
from rofu.models.rofu_naive import rofu_scores_naive
from rofu.service.deciding.explain import mean_gradients


@dataclass
class Setup:
    """One network, its data and the contexts every contender scores."""

    net: RewardNet
    data: RegulariserData
    neural_ucb: NeuralUCB
    config: RofuConfig
    served: RofuConfig


def _timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    def run(fn: Callable[[], object]) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    return run


def _setup(work: Workload, device: torch.device) -> Setup:
    gen = torch.Generator().manual_seed(0)
    net_config = RewardNetConfig(
        context_dim=work.context_dim, n_arms=work.n_arms, hidden=work.hidden
    )
    net = RewardNet(net_config).to(device)
    arms = torch.randint(work.n_arms, (work.n_data,), generator=gen)
    sample = Transitions(
        torch.randn(work.n_data, work.context_dim, generator=gen),
        arms,
        torch.randn(work.n_data, generator=gen),
    ).to(device)
    data = RegulariserData(sample, work.n_data, torch.bincount(arms, minlength=work.n_arms))
    neural_ucb = NeuralUCB(net_config, params=NeuralUCBParams(z="diag"), device=device)
    neural_ucb.net.load_state_dict(net.state_dict())
    config = RofuConfig(steps=work.steps, minibatch_size=work.minibatch)
    return Setup(net, data, neural_ucb, config, work.served_config())


def contenders(setup: Setup, contexts: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The functions timed for one batch of contexts, all on the same network and data."""
    net, data, config = setup.net, setup.data, setup.config
    ntk = dataclasses.replace(config, estimator="ntk")
    # The reference as it ran when the engine issue was filed: 256 pairs at a time.
    fixed = dataclasses.replace(config, chunk_size=256)

    def prepared(cfg: RofuConfig, *, cuda_graphs: bool = False) -> PreparedModel:
        """`cfg` prepared as the service prepares a checkpoint (`rofu.models.prepared`)."""
        gen = torch.Generator().manual_seed(2)
        return prepare(net, data, cfg, gen, cuda_graphs=cuda_graphs)

    def greedy() -> object:
        with torch.no_grad():
            return net.score_all(contexts).argmax(dim=1).cpu()

    def neural_ucb_diag() -> object:
        bonus = setup.neural_ucb.bonus(contexts)
        return (setup.neural_ucb.predict(contexts) + bonus).argmax(dim=1).cpu()

    def rofu(
        kernel: Literal["fast", "functional"], cfg: RofuConfig = config
    ) -> Callable[[], object]:
        model = prepared(cfg)
        return lambda: (
            score(model, contexts, torch.Generator().manual_seed(2), kernel=kernel)
            .ucb.argmax(dim=1)
            .cpu()
        )

    served_model = prepared(setup.served)
    candidates = torch.ones(contexts.shape[0], net.config.n_arms, dtype=torch.bool)
    uniforms = torch.rand(contexts.shape[0], generator=torch.Generator().manual_seed(3))

    def served() -> object:  # the served rule decides, as a replica's scorer does
        raw = score(served_model, contexts, torch.Generator().manual_seed(2))
        scores = Scores(raw.mean.cpu().double(), raw.bonus.cpu().double())
        return rofu_decide(scores, candidates, None, rule=setup.served.rule, uniforms=uniforms)

    fns: dict[str, Callable[[], object]] = {
        "served": served,
        "served_prepare": lambda: prepared(setup.served),
        "served_explain": lambda: mean_gradients(net, contexts, [None] * len(contexts)),
        "naive": lambda: rofu_scores_naive(
            net, contexts, data, config, torch.Generator().manual_seed(2)
        ),
        "rofu_reference": rofu("functional", fixed),
        "rofu_reference_chunked": rofu("functional"),
        "rofu_exact": rofu("fast"),
        "rofu_exact_chunk256": rofu("fast", fixed),
        "rofu_ntk": rofu("fast", ntk),
        "ntk_prepare": lambda: prepared(ntk),
        "neuralucb_diag": neural_ucb_diag,
        "greedy": greedy,
    }
    if contexts.is_cuda:
        graphed = prepared(config, cuda_graphs=True)
        assert graphed.graphs is not None  # exact, start baseline: capturable
        fns["rofu_exact_graphs"] = lambda: (
            score(graphed, contexts, torch.Generator().manual_seed(2)).ucb.argmax(dim=1).cpu()
        )
    return fns


def matmul_gflops(device: torch.device, repeats: int, size: int = 2048) -> float:
    """Median fp32 GFLOP/s of a size x size matrix product."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    timer = _timer(device)
    timer(lambda: a @ b)
    seconds = statistics.median(timer(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / seconds / 1e9


def measure(setup: Setup, batch: int, device: torch.device, repeats: int) -> dict[str, float]:
    """Median seconds per contender, repetitions interleaved round robin."""
    contexts = torch.randn(batch, setup.net.config.context_dim, generator=torch.Generator())
    fns = contenders(setup, contexts.to(device))
    timer = _timer(device)
    for fn in fns.values():  # warm-up
        timer(fn)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(timer(fn))
    return {name: statistics.median(values) for name, values in samples.items()}


def entry(work: Workload, batch: int, medians: dict[str, float], peak: float) -> dict[str, Any]:
    """One `contexts` entry: medians in ms, ratios, FLOPs, share of the matmul rate."""
    counted: dict[str, float | None] = {
        "rofu_reference": work.exact_flops(batch * work.n_arms),
        "rofu_reference_chunked": work.exact_flops(batch * work.n_arms),
        "rofu_exact": work.exact_flops(batch * work.n_arms, last_update=False),
        "rofu_exact_chunk256": work.exact_flops(batch * work.n_arms, last_update=False),
        "rofu_exact_graphs": work.exact_flops(batch * work.n_arms, last_update=False),
        "rofu_ntk": work.ntk_flops(batch),
        "ntk_prepare": work.ntk_prepare_flops(),
        "served": work.served_flops(batch),
    }
    flops = {name: f for name, f in counted.items() if name in medians and f is not None}
    out: dict[str, Any] = {f"{name}_ms": 1e3 * seconds for name, seconds in medians.items()}
    out["ratios"] = {
        "served_over_greedy": medians["served"] / medians["greedy"],
        "served_over_ntk": medians["served"] / medians["rofu_ntk"],
        "explain_over_served": medians["served_explain"] / medians["served"],
        "rofu_reference_over_exact": medians["rofu_reference"] / medians["rofu_exact"],
        "rofu_reference_chunked_over_exact": (
            medians["rofu_reference_chunked"] / medians["rofu_exact"]
        ),
        "exact_chunk256_over_exact": medians["rofu_exact_chunk256"] / medians["rofu_exact"],
        "rofu_reference_over_ntk": medians["rofu_reference"] / medians["rofu_ntk"],
        "ntk_over_neuralucb_diag": medians["rofu_ntk"] / medians["neuralucb_diag"],
        "exact_over_neuralucb_diag": medians["rofu_exact"] / medians["neuralucb_diag"],
        "naive_over_exact": medians["naive"] / medians["rofu_exact"],
    }
    if "rofu_exact_graphs" in medians:
        out["ratios"]["exact_over_graphs"] = medians["rofu_exact"] / medians["rofu_exact_graphs"]
    out["flops"] = flops
    out["share_of_matmul"] = {k: f / medians[k] / 1e9 / peak for k, f in flops.items()}
    out["flop_floor_ms"] = {k: 1e3 * f / 1e9 / peak for k, f in flops.items()}
    return out


def closeness(work: Workload, device: torch.device, contexts: int = 32) -> dict[str, Any]:
    """NTK against exact bonuses on a partly fitted network (float64), both baselines."""
    setup = _setup(work, device)
    net = setup.net.double()
    gen = torch.Generator().manual_seed(5)
    teacher = RewardNet(dataclasses.replace(net.config, seed=7)).double().to(device)
    sample = setup.data.sample.to(device, torch.float64)
    with torch.no_grad():
        rewards = teacher(sample.x, sample.arms) + 0.1 * torch.randn(
            len(sample), generator=gen, dtype=torch.float64
        ).to(device)
    sample = Transitions(sample.x, sample.arms, rewards)
    fit(net, sample, FitConfig(steps=300, batch_size=256, lr=1e-3), gen)
    data = RegulariserData(sample, setup.data.n_total, setup.data.arm_counts)
    x = torch.randn(contexts, work.context_dim, generator=gen, dtype=torch.float64).to(device)
    out: dict[str, Any] = {"contexts": contexts, "fit_steps": 300}
    for baseline in ("start", "drift"):
        got = {}
        for estimator in ("exact", "ntk"):
            cfg = dataclasses.replace(setup.config, baseline=baseline, estimator=estimator)
            got[estimator] = rofu_scores(net, x, data, cfg, torch.Generator().manual_seed(3))
        out[baseline] = _compared(got["exact"], got["ntk"])
    return out


def _compared(exact: Scores, ntk: Scores) -> dict[str, float | None]:
    a, b = exact.bonus.flatten(), ntk.bonus.flatten()
    both = (a > 0) & (b > 0)
    relative = ((b - a).abs() / a.clamp(min=1e-12))[both]
    same = exact.ucb.argmax(dim=1) == ntk.ucb.argmax(dim=1)
    return {
        "median_relative_difference": float(relative.median()) if both.any() else None,
        "p90_relative_difference": float(relative.quantile(0.9)) if both.any() else None,
        "exact_zero_share": float((a == 0).double().mean()),
        "ntk_zero_share": float((b == 0).double().mean()),
        "same_choice_share": float(same.double().mean()),
    }


def report(work: Workload, device: torch.device, repeats: int) -> dict[str, Any]:
    """Run the whole benchmark and return its figures."""
    peak = matmul_gflops(device, repeats)
    setup = _setup(work, device)
    entries = {}
    for batch in (1, 32):
        medians = measure(setup, batch, device, repeats)
        entries[str(batch)] = entry(work, batch, medians, peak)
    return {
        "workload": dataclasses.asdict(work) | {"hidden": list(work.hidden)},
        "served": dataclasses.asdict(work.served_config()),
        "device": str(device),
        "device_name": _device_name(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_average": list(os.getloadavg()),
        "repeats": repeats,
        "matmul_gflops": peak,
        "contexts": entries,
        "closeness": closeness(work, device),
    }


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def build_parser() -> argparse.ArgumentParser:
    """The parser of `rofu bench kernel`."""
    parser = argparse.ArgumentParser(prog="rofu bench kernel", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="where to time the kernels (default auto: cuda when available, else cpu)",
    )
    parser.add_argument(
        "--repeats", type=int, default=7, help="timed repetitions per contender (default 7)"
    )
    parser.add_argument("--json", dest="json_path", help="also write the figures as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m rofu.bench.kernel` and `rofu bench kernel`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    result = report(Workload(), torch.device(name), args.repeats)
    print(format_report(result))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as out:
            json.dump(result, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
