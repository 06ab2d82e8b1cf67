"""The bonus's forms side by side on one model late in a replay run: its shape and its cost.

For each data set, the product's `ROFU` plays T rounds of a seed's stream (the replay's
policy, `rofu.replay.simulation.policies.build_policy`); its final checkpoint (network and
data) is then prepared (`rofu.models.prepared.prepare`, as the server prepares it) with each
form of the bonus and scores the next `--contexts` rounds' contexts, which it never saw:

- `ntk`: the product preset itself (M capped ascent steps on the linearised objective);
- `closed@m`: its exact maximiser (`ntk-closed`) with the curvature on m sample rows;
- `kfac`: the same with Kronecker-factored curvature over every row (`ntk-kfac`).

Per form it reports the within-arm spread of the bonus across contexts (p90 / p10, the
median over arms and its range), how count-like it is (the spread across arms of
mean(bonus)^2 (n_a + 1), which a pure count bonus keeps at 1), for the closed form the share
of a query's |g|^2 inside the sample's span (the rest only the prior sees), and its cost:
the median time of one preparation and of one lone decision (batch 1, every arm), beside
the fp32 matmul rate measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rofu.bench.kernel import matmul_gflops
from rofu.models import RegulariserData, RofuConfig
from rofu.models.policies import RofuPolicy
from rofu.models.prepared import PreparedModel, prepare, score
from rofu.models.presets import PRODUCT
from rofu.models.reward_model import RewardModel
from rofu.models.rofu_closed import ClosedBasis, span_share
from rofu.models.rofu_ntk import features
from rofu.replay.simulation.bandits import Stream
from rofu.replay.simulation.datasets import DATASETS, load_bandit
from rofu.replay.simulation.policies import build_policy
from rofu.replay.simulation.simulate import simulate


def forms(l2: float, rows: tuple[int, ...]) -> dict[str, RofuConfig]:
    """The configurations compared: the product's, and the closed forms at prior `l2`."""
    closed = dataclasses.replace(PRODUCT.rofu, estimator="ntk-closed", l2=l2)
    out = {"ntk": PRODUCT.rofu}
    out |= {f"closed@{m}": dataclasses.replace(closed, closed_rows=m) for m in rows}
    out["kfac"] = dataclasses.replace(closed, estimator="ntk-kfac")
    return out


def _median_seconds(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def shape(bonus: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    """Within-arm p90 / p10 across contexts, and across arms mean(bonus)^2 (n_a + 1)."""
    spreads = []
    for arm in range(bonus.shape[1]):
        column = bonus[:, arm]
        low, high = np.percentile(column, [10, 90])
        if low > 0:
            spreads.append(high / low)
    count_like = (bonus.mean(axis=0) ** 2) * (counts + 1)
    positive = count_like[count_like > 0]
    return {
        "within_arm_p90_p10_median": float(np.median(spreads)) if spreads else float("nan"),
        "within_arm_p90_p10_min": float(min(spreads)) if spreads else float("nan"),
        "within_arm_p90_p10_max": float(max(spreads)) if spreads else float("nan"),
        "count_bonus_max_over_min": float(positive.max() / positive.min())
        if positive.size
        else float("nan"),
        "bonus_mean": float(bonus.mean()),
    }


def _span(prepared: PreparedModel, contexts: torch.Tensor) -> float | None:
    if not isinstance(prepared.basis, ClosedBasis):
        return None
    net = prepared.net
    theta: dict[str, torch.Tensor] = dict(net.named_parameters())
    n_arms = int(net.n_arms)
    owner = torch.arange(contexts.shape[0]).repeat_interleave(n_arms)
    arms = torch.arange(n_arms).repeat(contexts.shape[0])
    query = features(net, theta, contexts, arms, prepared.arm_features, owner)
    return float(span_share(prepared.basis, query).mean())


def measure_dataset(
    name: str, rounds: int, seed: int, n_contexts: int, configs: dict[str, RofuConfig], repeats: int
) -> dict[str, Any]:
    """Play `rounds` with the product's ROFU, then compare every form on fresh contexts."""
    bandit = load_bandit(name)
    stream = bandit.stream(rounds + n_contexts, seed)
    played = Stream(stream.contexts[:rounds], stream.rewards[:rounds], stream.means[:rounds])
    device = torch.device("cpu")
    policy = build_policy("ROFU", bandit.context_dim, bandit.n_arms, seed, device)
    assert isinstance(policy, RofuPolicy)
    started = time.process_time()
    run = simulate(policy, played, bandit=name, policy_name="ROFU", seed=seed)
    data = policy.buffer.regulariser_data(bandit.n_arms)
    first = next(policy.net.parameters())
    contexts = torch.from_numpy(stream.contexts[rounds:]).to(first.dtype)
    counts = data.arm_counts.numpy().astype(np.float64)
    results = {
        form: _measure_form(policy.net, data, config, contexts, counts, seed, repeats)
        for form, config in configs.items()
    }
    return {
        "rounds": rounds,
        "seed": seed,
        "contexts": n_contexts,
        "rows": len(data.sample),
        "final_pseudo_regret": run.final_pseudo_regret,
        "cpu_seconds": time.process_time() - started,
        "forms": results,
    }


def _measure_form(
    net: RewardModel,
    data: RegulariserData,
    config: RofuConfig,
    contexts: torch.Tensor,
    counts: np.ndarray,
    seed: int,
    repeats: int,
) -> dict[str, Any]:
    """One form's bonus shape and cost on the contexts, prepared as the server prepares."""
    generator = torch.Generator().manual_seed(seed)
    prepared = prepare(net, data, config, generator)
    scores = score(prepared, contexts, torch.Generator().manual_seed(seed))
    one = contexts[:1]

    def prepare_once() -> object:
        return prepare(net, data, config, torch.Generator().manual_seed(seed))

    def decide_once() -> object:
        return score(prepared, one, torch.Generator().manual_seed(0))

    return {
        **shape(scores.bonus.detach().numpy(), counts),
        "span_share": _span(prepared, contexts[:64]),
        "prepare_ms": 1e3 * _median_seconds(prepare_once, repeats),
        "decision_ms": 1e3 * _median_seconds(decide_once, repeats * 4),
    }


def format_report(result: dict[str, Any]) -> str:
    """The figures as a table per data set."""
    lines = [
        f"load average {result['load_average']}; fp32 matmul {result['matmul_gflops']:.1f} GFLOP/s",
        f"{'data set':10} {'form':12} {'p90/p10 med [min, max]':>26} {'count x':>8} "
        f"{'span':>6} {'prep ms':>9} {'decide ms':>10}",
    ]
    for name, entry in result["datasets"].items():
        for form, row in entry["forms"].items():
            span = "" if row["span_share"] is None else f"{row['span_share']:.2f}"
            spread = (
                f"{row['within_arm_p90_p10_median']:.2f} "
                f"[{row['within_arm_p90_p10_min']:.2f}, {row['within_arm_p90_p10_max']:.2f}]"
            )
            lines.append(
                f"{name:10} {form:12} {spread:>26} {row['count_bonus_max_over_min']:8.2f} "
                f"{span:>6} {row['prepare_ms']:9.2f} {row['decision_ms']:10.3f}"
            )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rofu bench bonus",
        description="the bonus's forms side by side on one model late in a replay run",
    )
    parser.add_argument("--datasets", default="adult,financial,jester,mushroom", help="names")
    parser.add_argument("--rounds", type=int, default=2000, help="rounds played first")
    parser.add_argument("--seed", type=int, default=1000, help="a tuning seed (1000+)")
    parser.add_argument("--contexts", type=int, default=300, help="fresh contexts scored")
    parser.add_argument("--l2", type=float, default=1.0, help="the closed forms' prior l2")
    parser.add_argument("--closed-rows", default="256,1024,4096", help="m values to compare")
    parser.add_argument("--repeats", type=int, default=5, help="timings per median")
    parser.add_argument(
        "--out", type=Path, default=Path("results/tmp/bench-bonus.json"), help="the JSON written"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [n.strip().lower() for n in args.datasets.split(",") if n.strip()]
    unknown = sorted(set(names) - set(DATASETS))
    if unknown:
        build_parser().error(f"unknown data sets {unknown}; choose from {', '.join(DATASETS)}")
    try:
        rows = tuple(int(m) for m in args.closed_rows.split(","))
    except ValueError:
        build_parser().error(f"--closed-rows must be integers, got {args.closed_rows!r}")
    configs = forms(args.l2, rows)
    result: dict[str, Any] = {
        "command": "rofu bench bonus " + " ".join(argv or []),
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "matmul_gflops": matmul_gflops(torch.device("cpu"), args.repeats),
        "torch_threads": torch.get_num_threads(),
        "datasets": {},
    }
    for name in names:
        print(f"rofu bench bonus: {name}, {args.rounds} rounds ...", file=sys.stderr, flush=True)
        result["datasets"][name] = measure_dataset(
            name, args.rounds, args.seed, args.contexts, configs, args.repeats
        )
    result["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(format_report(result))
    print(f"wrote {args.out}")
    return 0
