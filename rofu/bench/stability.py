"""ROFU's ascent stability along a replay run: rho, and NTK against exact at the same weights.

Not a timing. One ROFU run of the replay (a data set, a preset or variant, a seed) is
played as `rofu replay` plays it; every `--every` rounds, at the policy's current weights
and data, it records:

- rho = step x the regulariser's largest curvature (`rofu.models.rofu_stability`): the ascent
  is monotone up to 1 and diverges past 2;
- with `--contexts N` (> 0), the mean and largest bonus of the `ntk` and `exact`
  estimators on N fixed contexts of the data set, both at those weights and minibatches,
  with the policy's own step (after its cap, if it has one);
- the weights' norm and the rows held.

    rofu bench stability --dataset mushroom --preset small-lr --policy ROFU@cap=none \\
        --seed 2 --rounds 20000 --every 1000 --json stability-mushroom.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rofu.models.policies import RofuPolicy
from rofu.models.rofu import rofu_scores
from rofu.models.rofu_stability import ascent_stiffness, capped_step
from rofu.replay.runner import Job, job_policy
from rofu.replay.simulation.datasets import load_bandit
from rofu.replay.simulation.simulate import simulate

#: Seed of the fixed contexts both estimators score (drawn from the data set's stream).
CONTEXT_SEED = 12_345
#: Seed of the minibatches both estimators draw at a checkpoint.
MINIBATCH_SEED = 7


def checkpoint(policy: RofuPolicy, contexts: torch.Tensor | None) -> dict[str, Any]:
    """What the policy's current weights and data give (see the module docstring)."""
    data = policy.buffer.regulariser_data(policy.n_arms)
    theta = {name: p.detach() for name, p in policy.net.named_parameters()}
    rho = ascent_stiffness(policy.net, data, policy.rofu, theta, policy.arm_features)
    step = capped_step(policy.rofu, rho)  # the step the policy's own cap resolves to
    resolved = dataclasses.replace(policy.rofu, step_size=step, stability_cap=None)
    row: dict[str, Any] = {
        "rows": len(data.sample),
        "rho": rho,
        "weight_norm": float(torch.cat([p.flatten() for p in theta.values()]).norm()),
        "step": step,
    }
    if contexts is not None:
        for estimator in ("ntk", "exact"):
            bonus = rofu_scores(
                policy.net,
                contexts,
                data,
                dataclasses.replace(resolved, estimator=estimator),
                torch.Generator().manual_seed(MINIBATCH_SEED),
                arm_features=policy.arm_features,
            ).bonus.detach()
            row[f"{estimator}_bonus_mean"] = float(bonus.nanmean())
            row[f"{estimator}_bonus_max"] = float(bonus.nan_to_num(-1.0).max())
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Play the run and collect a row every `args.every` rounds."""
    job = Job(args.dataset, args.policy, args.seed, args.rounds, preset=args.preset)
    bandit = load_bandit(args.dataset, args.data_dir)
    policy, config = job_policy(job, bandit, torch.device("cpu"))
    if not isinstance(policy, RofuPolicy):
        raise SystemExit(f"rofu bench stability: {args.policy} is not a ROFU policy")
    contexts = None
    if args.contexts:
        probe = bandit.stream(args.contexts, CONTEXT_SEED).contexts
        contexts = torch.from_numpy(probe).to(next(policy.net.parameters()).dtype)
    rows: list[dict[str, Any]] = []

    def on_round(t: int) -> None:
        if (t + 1) % args.every == 0 and len(policy.buffer):
            rows.append({"round": t + 1} | checkpoint(policy, contexts))
            if args.verbose:
                print(json.dumps(rows[-1]), flush=True)

    started = time.perf_counter()
    result = simulate(
        policy,
        bandit.stream(args.rounds, args.seed),
        bandit=args.dataset,
        policy_name=args.policy,
        seed=args.seed,
        config=config,
        on_round=on_round,
    )
    bonus = result.bonus if result.bonus is not None else np.full(args.rounds, np.nan)
    tenths = [  # None where every round of the tenth was a warm-start round (no bonus)
        float(np.nanmean(part)) if np.isfinite(part).any() else None
        for part in np.array_split(bonus, 10)
    ]
    return {
        "command": "rofu bench stability " + " ".join(args.argv),
        "dataset": args.dataset,
        "policy": args.policy,
        "preset": args.preset,
        "seed": args.seed,
        "rounds": args.rounds,
        "config": config,
        "checkpoints": rows,
        "chosen_bonus_by_tenth": tenths,
        "pseudo_regret": result.final_pseudo_regret,
        "seconds": time.perf_counter() - started,
        "load_average": list(os.getloadavg()),
    }


def format_report(result: dict[str, Any]) -> str:
    """The checkpoints as a table."""
    lines = [
        f"{result['dataset']} / {result['policy']} ({result['preset']}), seed {result['seed']}, "
        f"T = {result['rounds']}: pseudo-regret {result['pseudo_regret']:.1f}",
        "round   rho      step      |theta|   ntk bonus (mean, max)   exact bonus (mean, max)",
    ]
    for row in result["checkpoints"]:
        pairs = [
            f"{row[f'{e}_bonus_mean']:8.4f} {row[f'{e}_bonus_max']:8.4f}"
            if f"{e}_bonus_mean" in row
            else f"{'-':>8} {'-':>8}"
            for e in ("ntk", "exact")
        ]
        lines.append(
            f"{row['round']:>6} {row['rho']:7.3f} {row['step']:9.2e} {row['weight_norm']:8.2f}"
            f"   {pairs[0]}       {pairs[1]}"
        )
    lines.append(
        "bonus of the chosen arm, mean by tenth: "
        + ", ".join("-" if v is None else f"{v:.3g}" for v in result["chosen_bonus_by_tenth"])
    )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The parser of `rofu bench stability`."""
    parser = argparse.ArgumentParser(
        prog="rofu bench stability", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dataset", required=True, help="a registered data set (rofu replay)")
    parser.add_argument(
        "--policy", default="ROFU", help="ROFU or a ROFU variant, e.g. ROFU@cap=1 (default ROFU)"
    )
    parser.add_argument("--preset", default="product", help="ROFU's preset (default product)")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    parser.add_argument("--rounds", type=int, default=20_000, help="T (default 20 000)")
    parser.add_argument("--every", type=int, default=1_000, help="rounds between checkpoints")
    parser.add_argument(
        "--contexts",
        type=int,
        default=64,
        help="fixed contexts NTK and exact score at each checkpoint (0: rho only)",
    )
    parser.add_argument("--data-dir", type=Path, help="the benchmark data folder")
    parser.add_argument("--json", dest="json_path", help="also write the figures as JSON here")
    parser.add_argument("--verbose", action="store_true", help="print each checkpoint's row")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m rofu.bench.stability` and `rofu bench stability`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("rounds", "every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.contexts < 0 or args.seed < 0:
        parser.error("--contexts and --seed must be >= 0")
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    try:
        result = run(args)
    except ValueError as error:  # an unknown data set, policy or preset, named
        parser.error(str(error))
    print(format_report(result))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as out:
            json.dump(result, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
