"""Bonus curves: the exploration bonus of the chosen arm, round by round, per policy.

Each run's summary keeps the bonus of the arm it chose as block means at `curve_rounds(T)`
and, for the table, its sums and counts over the first and last tenth of the rounds after
the warm start (`rofu.replay.simulation.summary.BonusSummary`); a curve is the mean over
seeds, smoothed by a moving average. The ablation of the paper's section 5.1 reads them:
ROFU's bonus should grow with M, its ascent steps, and decay towards 0 as data
accumulates. Policies without a bonus (Greedy, EpsilonGreedy: always 0) and runs written
before bonuses were recorded are left out. `step_table` says how often ROFU's stability
cap cut the ascent step, from the steps each run's summary counted.
"""

from __future__ import annotations

import math
import re

import numpy as np

from rofu.replay.simulation.summary import TAIL, BonusSummary, RunSummary, curve_rounds

Results = dict[str, dict[str, list[RunSummary]]]


def natural(name: str) -> list[str | int]:
    """A sort key that puts `ROFU@steps=5` before `ROFU@steps=10`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def with_bonus(results: Results) -> Results:
    """The runs that recorded a bonus, of the policies whose bonus is not always 0."""
    kept: Results = {}
    for bandit, by_policy in sorted(results.items()):
        for policy, runs in sorted(by_policy.items(), key=lambda item: natural(item[0])):
            recorded = [run for run in runs if run.bonus is not None]
            if any(_bonus(run).nonzero for run in recorded):
                kept.setdefault(bandit, {})[policy] = recorded
    return kept


def _bonus(run: RunSummary) -> BonusSummary:
    assert run.bonus is not None
    return run.bonus


def mean_curve(runs: list[RunSummary]) -> tuple[np.ndarray, np.ndarray]:
    """((n,) the rounds each block of the bonus curve ends at, (n,) the bonus of the chosen
    arm averaged over seeds there, NaN where no seed has one)."""
    stacked = np.array(
        [[math.nan if v is None else v for v in _bonus(run).curve] for run in runs], dtype=float
    )  # (seeds, n)
    counts = np.isfinite(stacked).sum(axis=0)
    total = np.nansum(stacked, axis=0)
    mean = np.where(counts > 0, total / np.maximum(counts, 1), np.nan)
    return curve_rounds(runs[0].rounds, stacked.shape[1]), mean


def smooth(curve: np.ndarray, window: int) -> np.ndarray:
    """Moving average over the last `window` points, skipping NaN (NaN where all are)."""
    values = np.nan_to_num(curve)
    present = np.isfinite(curve).astype(float)
    kernel = np.ones(window)
    total = np.convolve(values, kernel)[: len(curve)]
    count = np.convolve(present, kernel)[: len(curve)]
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def early_late(runs: list[RunSummary]) -> tuple[float, float]:
    """Mean bonus over the first and the last TAIL of the rounds after the warm start,
    pooled over seeds (NaN where no round has one)."""

    def pooled(part: str) -> float:
        sums, counts = zip(*(getattr(_bonus(run), part) for run in runs), strict=True)
        return float(sum(sums) / sum(counts)) if sum(counts) else math.nan

    return pooled("early"), pooled("late")


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
            largest = max(_bonus(run).largest for run in runs)
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
            recorded = [run.ascent for run in runs if run.ascent is not None]
            if not recorded:
                continue
            rounds = sum(steps.rounds for steps in recorded)
            capped = sum(steps.capped for steps in recorded)
            cuts = np.concatenate([steps.cuts() for steps in recorded])  # (capped,)
            smallest = min((s.smallest for s in recorded if s.smallest is not None), default=None)
            lines.append(
                f"| {bandit} | {policy} | {len(recorded)} of {len(runs)} | "
                f"{recorded[0].set_step:g} | {capped / max(rounds, 1):.1%} | "
                f"{f'{np.median(cuts):.3g}' if cuts.size else '-'} | "
                f"{'-' if smallest is None else f'{smallest:.3g}'} |"
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
