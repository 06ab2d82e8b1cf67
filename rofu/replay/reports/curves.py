"""The replay report's figures (PNG): regret curves and bonus curves, one file per data set,
drawn from the runs' summaries (at most `CURVE_POINTS` points a curve)."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from rofu.replay.reports.bonus import Results, mean_curve, smooth, with_bonus
from rofu.replay.reports.paired import reference_of
from rofu.replay.simulation.summary import curve_rounds

#: Colours of a saved plot (a palette PNG).
PALETTE = 64


def plot_regret(results: Results, folder: Path) -> list[Path]:
    """One PNG per data set: mean cumulative pseudo-regret with a +- s.e.m. band."""
    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for bandit, by_policy in sorted(results.items()):
        figure, axis = plt.subplots(figsize=(7, 4.5))
        for index, (policy, runs) in enumerate(sorted(by_policy.items())):
            curves = np.array([r.regret_curve for r in runs])  # (seeds, n)
            mean = curves.mean(axis=0)
            band = curves.std(axis=0, ddof=1) / math.sqrt(len(runs)) if len(runs) > 1 else 0
            steps = curve_rounds(runs[0].rounds)
            axis.plot(
                steps,
                mean,
                label=policy,
                linewidth=2.5 if policy == reference_of(by_policy) else 1.2,
                linestyle="-" if index < 10 else "--",  # past the 10-colour cycle
            )
            axis.fill_between(steps, mean - band, mean + band, alpha=0.15)
        axis.set(
            title=f"{bandit}: cumulative pseudo-regret",
            xlabel="round",
            ylabel="regret (mean +- s.e.m.)",
        )
        axis.legend(fontsize=8, ncol=2)
        paths.append(_save(figure, folder / f"regret-{bandit}.png"))
    return paths


def plot_bonus(results: Results, folder: Path) -> list[Path]:
    """One PNG per data set with a bonus: its smoothed mean-bonus curve per policy, on a
    linear axis cut at the largest value after the first tenth of the rounds (left) and on
    a log axis in full (right)."""
    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for bandit, by_policy in with_bonus(results).items():
        figure, (linear, log) = plt.subplots(1, 2, figsize=(11, 4.5))
        curves = {policy: mean_curve(runs) for policy, runs in by_policy.items()}
        points = max(curve.size for _, curve in curves.values())  # at most CURVE_POINTS
        window = max(1, points // 50)  # points, a fiftieth of the rounds
        rounds = max(int(steps[-1]) for steps, _ in curves.values())
        top = 0.0
        for policy, (steps, curve) in curves.items():
            smoothed = smooth(curve, window)
            label = f"{policy} ({len(by_policy[policy])} seeds)"
            for axis in (linear, log):
                axis.plot(steps, smoothed, label=label)
            top = max(top, float(np.nanmax(smoothed[curve.size // 10 :], initial=0.0)))
        linear.set(ylim=(0, 1.1 * top or None), title=f"{bandit}: bonus of the chosen arm")
        log.set(yscale="log", title="the same, log axis, uncut")
        for axis in (linear, log):
            axis.set(xlabel="round", ylabel=f"mean over seeds, last {max(1, rounds // 50)} rounds")
        linear.legend(fontsize=8)
        paths.append(_save(figure, folder / f"bonus-{bandit}.png"))
    return paths


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display; imported only to draw)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure: Any, path: Path) -> Path:
    """The figure as a PNG of at most `PALETTE` colours: line plots need no more, and the
    committed reports' plots stay a third of their truecolour size."""
    from PIL import Image  # matplotlib's own dependency

    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=110, format="png")
    _pyplot().close(figure)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=PALETTE).save(path, optimize=True)
    return path
