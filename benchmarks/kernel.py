"""ROFU kernel benchmark: the contenders timed side by side, interleaved, in one run.

At the reference workload (context dim 64, 10 arms, MLP 64-100-100-10, M = 5, regulariser
minibatch 256, |D| = 20 000) it times, for 1 and for 32 concurrent contexts: the naive
per-arm loop, batched ROFU, NeuralUCB-diagonal scoring and greedy scoring on the same
network, plus a plain fp32 matrix product for the machine's throughput. Repetitions are
interleaved (round robin) so that load on a shared machine hits every contender alike.

    python -m benchmarks.kernel [--device cpu|cuda] [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from models import RegulariserData, RewardNet, RewardNetConfig, RofuConfig, Transitions
from models.policies import NeuralUCB
from models.rofu import rofu_scores
from models.rofu_naive import rofu_scores_naive


@dataclass(frozen=True)
class Workload:
    """The reference workload of the engine issue."""

    context_dim: int = 64
    n_arms: int = 10
    hidden: tuple[int, ...] = (100, 100)
    steps: int = 5
    minibatch: int = 256
    n_data: int = 20_000

    def widths(self) -> list[tuple[int, int]]:
        dims = [self.context_dim, *self.hidden, self.n_arms]
        return list(zip(dims[:-1], dims[1:], strict=True))

    def rofu_flops(self, pairs: int) -> float:
        """FLOPs batched ROFU executes for `pairs` (context, arm) pairs.

        Forward costs 2 * sum(in * out) per row; backward 2 * sum(in * out) for weight
        gradients plus the same for input gradients except the first layer's. Step 1 is
        one shared minibatch gradient plus a single-row gradient per pair; steps 2..M run
        per pair over minibatch + query row; plus the forward at theta and at theta_M.
        """
        fwd = 2 * sum(i * o for i, o in self.widths())
        bwd = 2 * fwd - 2 * self.widths()[0][0] * self.widths()[0][1]
        step = fwd + bwd
        per_pair = (self.steps - 1) * (self.minibatch + 1) * step + step + 2 * fwd
        return float(pairs * per_pair + (self.minibatch * step if self.steps else 0))


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


def _setup(work: Workload, device: torch.device) -> tuple[RewardNet, RegulariserData, NeuralUCB]:
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
    neural_ucb = NeuralUCB(net_config, z="diag", device=device)
    neural_ucb.net.load_state_dict(net.state_dict())
    return net, data, neural_ucb


def contenders(work: Workload, batch: int, device: torch.device) -> dict[str, Callable[[], object]]:
    """The functions timed for one batch size, all on the same network and data."""
    net, data, neural_ucb = _setup(work, device)
    contexts = torch.randn(batch, work.context_dim, generator=torch.Generator().manual_seed(1))
    contexts = contexts.to(device)
    config = RofuConfig(steps=work.steps, minibatch_size=work.minibatch)

    def greedy() -> object:
        with torch.no_grad():
            return net.score_all(contexts).argmax(dim=1).cpu()

    def neural_ucb_diag() -> object:
        return (neural_ucb.predict(contexts) + neural_ucb.bonus(contexts)).argmax(dim=1).cpu()

    return {
        "naive loop": lambda: rofu_scores_naive(
            net, contexts, data, config, torch.Generator().manual_seed(2)
        ),
        "batched ROFU": lambda: rofu_scores(
            net, contexts, data, config, torch.Generator().manual_seed(2)
        ).ucb.cpu(),
        "NeuralUCB-diag": neural_ucb_diag,
        "greedy": greedy,
    }


def matmul_gflops(device: torch.device, repeats: int, size: int = 2048) -> float:
    """Median fp32 GFLOP/s of a size x size matrix product."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    timer = _timer(device)
    timer(lambda: a @ b)
    seconds = statistics.median(timer(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / seconds / 1e9


def measure(work: Workload, batch: int, device: torch.device, repeats: int) -> dict[str, float]:
    """Median seconds per contender, repetitions interleaved round robin."""
    fns = contenders(work, batch, device)
    timer = _timer(device)
    for fn in fns.values():  # warm-up
        timer(fn)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(timer(fn))
    return {name: statistics.median(values) for name, values in samples.items()}


def report(work: Workload, device: torch.device, repeats: int) -> dict[str, object]:
    """Run the whole benchmark and return its figures."""
    peak = matmul_gflops(device, repeats)
    rows = []
    for batch in (1, 32):
        medians = measure(work, batch, device, repeats)
        rofu_gflops = work.rofu_flops(batch * work.n_arms) / medians["batched ROFU"] / 1e9
        rows.append(
            {
                "contexts": batch,
                "median_ms": {k: 1e3 * v for k, v in medians.items()},
                "naive_over_batched": medians["naive loop"] / medians["batched ROFU"],
                "batched_over_neuralucb_diag": medians["batched ROFU"] / medians["NeuralUCB-diag"],
                "rofu_gflops": rofu_gflops,
                "rofu_share_of_matmul": rofu_gflops / peak,
            }
        )
    return {
        "workload": work.__dict__ | {"hidden": list(work.hidden)},
        "device": str(device),
        "device_name": _device_name(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "repeats": repeats,
        "matmul_gflops": peak,
        "rows": rows,
    }


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def format_report(result: dict[str, object]) -> str:
    """A plain-text table of `report` output."""
    work = result["workload"]
    assert isinstance(work, dict)
    lines = [
        f"ROFU kernel benchmark on {result['device']} ({result['device_name']}, "
        f"{result['threads']} threads, torch {result['torch']}), median of "
        f"{result['repeats']} interleaved runs",
        f"workload: D={work['context_dim']}, A={work['n_arms']}, MLP "
        f"{work['context_dim']}-{'-'.join(map(str, work['hidden']))}-{work['n_arms']}, "
        f"M={work['steps']}, minibatch={work['minibatch']}, |D|={work['n_data']}",
        f"fp32 matmul 2048x2048: {result['matmul_gflops']:.1f} GFLOP/s",
        "",
        f"{'contexts':>8}  {'contender':<15} {'median ms':>10} {'ms/context':>11}",
    ]
    rows = result["rows"]
    assert isinstance(rows, list)
    for row in rows:
        for name, ms in row["median_ms"].items():
            lines.append(
                f"{row['contexts']:>8}  {name:<15} {ms:>10.2f} {ms / row['contexts']:>11.3f}"
            )
        lines.append(
            f"{'':>8}  naive/batched = {row['naive_over_batched']:.2f}x, "
            f"batched/NeuralUCB-diag = {row['batched_over_neuralucb_diag']:.1f}x, "
            f"batched ROFU {row['rofu_gflops']:.1f} GFLOP/s = "
            f"{100 * row['rofu_share_of_matmul']:.0f}% of matmul"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m benchmarks.kernel` and `rofu bench kernel`."""
    parser = argparse.ArgumentParser(prog="rofu bench kernel", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", dest="json_path", help="also write the figures as JSON here")
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
