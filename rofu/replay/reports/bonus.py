"""Bonus curves: the exploration bonus of the chosen arm, round by round, per policy.

Each run records the bonus of the arm it chose in every round (`RunResult.bonus`); a curve
is its mean over seeds, smoothed by a moving average. The ablation of the paper's section
5.1 reads them: ROFU's bonus should grow with M, its ascent steps, and decay towards 0 as
data accumulates. Policies without a bonus (Greedy, EpsilonGreedy: always 0) and runs
written before bonuses were recorded are left out. `step_table` says how often ROFU's
stability cap cut the ascent step, from the step each round recorded.
"""

from __future__ import annotations

import math
import re

import numpy as np

from rofu.replay.simulation.simulate import RunResult

Results = dict[str, dict[str, list[RunResult]]]
TAIL = 0.1  # the share of the rounds the early and late means are taken over


def natural(name: str) -> list[str | int]:
    """A sort key that puts `ROFU@steps=5` before `ROFU@steps=10`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def with_bonus(results: Results) -> Results:
    """The runs that recorded a bonus, of the policies whose bonus is not always 0."""
    kept: Results = {}
    for bandit, by_policy in sorted(results.items()):
        for policy, runs in sorted(by_policy.items(), key=lambda item: natural(item[0])):
            recorded = [run for run in runs if run.bonus is not None]
            if any(np.nanmax(np.abs(_finite(run)), initial=0.0) > 0 for run in recorded):
                kept.setdefault(bandit, {})[policy] = recorded
    return kept


def _finite(run: RunResult) -> np.ndarray:
    """(T,) the run's bonus, NaN where it is not finite (warm start, cold start)."""
    assert run.bonus is not None
    return np.where(np.isfinite(run.bonus), run.bonus, np.nan)


def mean_curve(runs: list[RunResult]) -> np.ndarray:
    """(T,) the bonus of the chosen arm averaged over seeds (NaN where no seed has one)."""
    stacked = np.stack([_finite(run) for run in runs])  # (seeds, T)
    counts = np.isfinite(stacked).sum(axis=0)
    total = np.nansum(stacked, axis=0)
    return np.where(counts > 0, total / np.maximum(counts, 1), np.nan)


def smooth(curve: np.ndarray, window: int) -> np.ndarray:
    """Moving average over the last `window` rounds, skipping NaN (NaN where all are)."""
    values = np.nan_to_num(curve)
    present = np.isfinite(curve).astype(float)
    kernel = np.ones(window)
    total = np.convolve(values, kernel)[: len(curve)]
    count = np.convolve(present, kernel)[: len(curve)]
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def early_late(runs: list[RunResult]) -> tuple[float, float]:
    """Mean bonus over the first and the last TAIL of the rounds that have one."""
    curve = mean_curve(runs)
    rounds = curve[np.isfinite(curve)]
    if not rounds.size:
        return math.nan, math.nan
    tail = max(1, int(TAIL * rounds.size))
    return float(rounds[:tail].mean()), float(rounds[-tail:].mean())


def markdown_table(results: Results) -> str:
    """Per data set and policy: the mean bonus early and late, their ratio, and the largest
    bonus of any round of any seed (a diverged ascent shows there)."""
    lines = [
        f"Mean bonus of the chosen arm over the first and last {TAIL:.0%} of the rounds after "
        "the warm start, averaged over seeds; the largest of any round and seed.",
        "",
        "| data set | policy | early | late | late / early | largest |",
        "|---|---|---|---|---|---|",
    ]
    for bandit, by_policy in with_bonus(results).items():
        for policy, runs in by_policy.items():
            early, late = early_late(runs)
            ratio = f"{late / early:.2f}" if early > 0 else "n/a"
            largest = max(float(np.nanmax(_finite(run), initial=0.0)) for run in runs)
            lines.append(
                f"| {bandit} | {policy} | {early:.4f} | {late:.4f} | {ratio} | {largest:.3g} |"
            )
    return "\n".join(lines) + "\n"


def step_table(results: Results) -> str:
    """Per data set and ROFU policy whose runs recorded their ascent step: how often the
    stability cap cut the step (rounds scored with less than the set step) and by how much.
    Empty when no run recorded one (files before 2026-11-25, no ROFU policy)."""
    lines = []
    for bandit, by_policy in sorted(results.items()):
        for policy, runs in sorted(by_policy.items(), key=lambda item: natural(item[0])):
            recorded = [run for run in runs if run.ascent_step is not None and _set_step(run)]
            if not recorded:
                continue
            scale = np.concatenate([_scale(run) for run in recorded])  # (rounds,)
            capped = scale[scale < 1.0 - 1e-9]
            median = f"{np.median(capped):.3g}" if capped.size else "-"
            smallest = f"{capped.min():.3g}" if capped.size else "-"
            lines.append(
                f"| {bandit} | {policy} | {len(recorded)} of {len(runs)} | "
                f"{_set_step(recorded[0]):g} | {capped.size / max(scale.size, 1):.1%} | "
                f"{median} | {smallest} |"
            )
    if not lines:
        return ""
    head = [
        "The step each ROFU round was scored with, against the set step: the share of rounds "
        "whose checkpoint's stability cap cut it (rho = step x the regulariser's curvature "
        "past the cap; `rofu/models/rofu_stability.py`), and the cut step / set step over those "
        "rounds. Only runs that recorded their step (seeds: of the cell's).",
        "",
        "| data set | policy | seeds | set step | rounds capped | cut: median | cut: smallest |",
        "|---|---|---|---|---|---|---|",
    ]
    return "\n".join(head + lines) + "\n"


def _set_step(run: RunResult) -> float:
    """The step the run's configuration set (0 where it recorded none)."""
    params = (run.config or {}).get("params") or {}
    return float(params.get("step_size") or 0.0)


def _scale(run: RunResult) -> np.ndarray:
    """(rounds,) the recorded step over the set step, in the rounds that recorded one."""
    assert run.ascent_step is not None
    steps: np.ndarray = run.ascent_step[np.isfinite(run.ascent_step)] / _set_step(run)
    return steps
