"""The replay report's table: one cell per (data set, policy), its statistics over seeds,
the ranks, the normalisations and the paired tests, and their Markdown.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import stats

from rofu.replay.reports.paired import holm, paired_wilcoxon, reference_of, sem
from rofu.replay.simulation.summary import RunSummary

PAPER_ROUNDS = 20_000  # the running-time table's unit, as in the paper
REGRET2_HEADING = (
    "Final regret II (the paper's Table 2 metric: against an MLP trained offline on the "
    "full-information data, rofu/replay/simulation/oracle.py), mean +- s.e.m.; n/a: "
    "a run of the cell has none"
)


@dataclass(frozen=True)
class Cell:
    """One (data set, policy) entry of the report."""

    mean: float  # final cumulative pseudo-regret, mean over seeds
    sem: float
    realised_mean: float  # the same with realised regret
    seeds: list[int]
    rounds: int
    seconds_per_round: float
    normalised: float = math.nan  # mean / best mean of the data set
    relative_uniform: float = math.nan  # 100 * mean / Uniform's mean
    rank: float = math.nan
    wilcoxon_p: float = math.nan  # paired test against ROFU over common seeds
    # wilcoxon_p after Holm's step-down correction over the data set's tests
    wilcoxon_holm: float = math.nan
    cpu_seconds_per_round: float = math.nan  # NaN unless every run recorded its CPU time
    finals: list[float] = field(default_factory=list)  # per seed, in the order of `seeds`
    # CPU seconds per round per seed, in the order of `seeds`; empty unless every run has one
    cpu_per_seed: list[float] = field(default_factory=list)
    source: str = ""  # the report folder a combined report took the cell from
    preset: str = ""  # the ROFU preset its runs recorded (rofu.models.presets); "" for others
    # final regret II (rofu.replay.simulation.oracle), mean and s.e.m. over seeds; NaN
    # unless every run of the cell recorded it
    regret2_mean: float = math.nan
    regret2_sem: float = math.nan

    @property
    def has_finals(self) -> bool:
        """Whether per-seed finals were kept (reports before they were have none)."""
        return bool(self.finals) and len(self.finals) == len(self.seeds)


def _cpu_per_seed(runs: list[RunSummary]) -> list[float]:
    """Each run's CPU seconds per round; empty when any run recorded no CPU time."""
    if any(r.cpu_seconds is None for r in runs):
        return []
    return [r.cpu_seconds / r.rounds for r in runs if r.cpu_seconds is not None]


def _regret2(runs: list[RunSummary]) -> tuple[float, float]:
    """A cell's regret II mean and s.e.m.; NaN unless every run has one."""
    finals = [r.final_regret2 for r in runs]
    if any(v is None for v in finals):
        return math.nan, math.nan
    values = np.array(finals, dtype=np.float64)
    return float(values.mean()), sem(values)


def summarise(results: dict[str, dict[str, list[RunSummary]]]) -> dict[str, dict[str, Cell]]:
    """Cells for every data set and policy, with the cross-policy figures filled in."""
    table: dict[str, dict[str, Cell]] = {}
    for bandit, by_policy in results.items():
        cells = {}
        for policy, runs in by_policy.items():
            runs = sorted(runs, key=lambda r: r.seed)
            values = np.array([r.final_pseudo_regret for r in runs])
            cpu = _cpu_per_seed(runs)
            two, two_sem = _regret2(runs)
            cells[policy] = Cell(
                mean=float(values.mean()),
                sem=sem(values),
                realised_mean=float(np.mean([r.final_regret for r in runs])),
                seeds=[r.seed for r in runs],
                rounds=runs[0].rounds,
                seconds_per_round=float(np.mean([r.seconds / r.rounds for r in runs])),
                cpu_seconds_per_round=float(np.mean(cpu)) if cpu else math.nan,
                finals=[float(v) for v in values],
                cpu_per_seed=cpu,
                preset=", ".join(sorted({r.preset for r in runs if r.preset})),
                regret2_mean=two,
                regret2_sem=two_sem,
            )
        table[bandit] = compare(cells)
    return table


def compare(cells: dict[str, Cell]) -> dict[str, Cell]:
    """One data set's cells with normalised regret, Uniform = 100, rank and Wilcoxon p."""
    best = min(c.mean for c in cells.values())
    uniform = cells.get("Uniform")
    finals = {
        p: dict(zip(c.seeds, c.finals, strict=True)) for p, c in cells.items() if c.has_finals
    }  # no test for cells without per-seed finals
    ranks = stats.rankdata([c.mean for c in cells.values()])
    reference = reference_of(cells)
    tests = {
        policy: paired_wilcoxon(finals[policy], finals[reference])
        if reference in finals and policy in finals and policy != reference
        else math.nan
        for policy in cells
    }
    adjusted = holm(tests)
    return {
        policy: replace(
            cell,
            normalised=cell.mean / best if best > 0 else math.nan,
            relative_uniform=100 * cell.mean / uniform.mean
            if uniform and uniform.mean > 0
            else math.nan,
            rank=float(rank),
            wilcoxon_p=tests[policy],
            wilcoxon_holm=adjusted[policy],
        )
        for (policy, cell), rank in zip(cells.items(), ranks, strict=True)
    }


def _mean_per_policy(table: dict[str, dict[str, Cell]], figure: str) -> dict[str, float]:
    """A cell figure averaged per policy over the data sets it ran on."""
    values: dict[str, list[float]] = defaultdict(list)
    for cells in table.values():
        for policy, cell in cells.items():
            values[policy].append(getattr(cell, figure))
    return {p: float(np.mean(v)) for p, v in values.items()}


def mean_normalised(table: dict[str, dict[str, Cell]]) -> dict[str, float]:
    """Average regret normalised to the best, over the data sets a policy ran on (the
    paper's "Mean" column; 1 = best everywhere)."""
    return _mean_per_policy(table, "normalised")


def mean_ranks(table: dict[str, dict[str, Cell]]) -> dict[str, float]:
    """Average rank of each policy over the data sets it ran on (1 = best), best first."""
    return dict(sorted(_mean_per_policy(table, "rank").items(), key=lambda kv: kv[1]))


def fmt(value: float, digits: int = 2) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def seed_ranges(seeds: list[int]) -> str:
    """[0, 1, 2, 5, 1000, 1001] -> '0-2, 5, 1000-1001'."""
    parts: list[list[int]] = []
    for seed in sorted(seeds):
        if parts and seed == parts[-1][-1] + 1:
            parts[-1].append(seed)
        else:
            parts.append([seed])
    return ", ".join(f"{p[0]}-{p[-1]}" if len(p) > 1 else str(p[0]) for p in parts)


def cell_text(cell: Cell | None, value: str) -> str:
    if cell is None:
        return "-"
    if value in ("raw", "raw+preset"):
        raw = f"{cell.mean:.1f} +- {fmt(cell.sem, 1)}"
        return f"{raw} (`{cell.preset}`)" if value == "raw+preset" and cell.preset else raw
    if value == "regret2":
        two = cell.regret2_mean
        return "n/a" if math.isnan(two) else f"{two:.1f} +- {fmt(cell.regret2_sem, 1)}"
    if value == "time":
        return f"{1000 * cell.seconds_per_round:.2f}"
    if value == "cpu":
        return fmt(PAPER_ROUNDS * cell.cpu_seconds_per_round, 0)
    if value == "runs":
        return f"{len(cell.seeds)} x T={cell.rounds} (seeds {seed_ranges(cell.seeds)})"
    if value == "source":
        return f"`{cell.source}`"
    if value == "preset":
        return f"`{cell.preset}`" if cell.preset else "-"
    return fmt(getattr(cell, value), 3 if value.startswith("wilcoxon") else 2)


def grid_lines(
    table: dict[str, dict[str, Cell]], heading: str, value: str, policies: list[str]
) -> list[str]:
    """One figure (`value`, as `cell_text` reads it) as a policy x data set table."""
    bandits = sorted(table)
    lines = [
        f"## {heading}",
        "",
        "| policy | " + " | ".join(bandits) + " |",
        "|---|" + "---|" * len(bandits),
    ]
    for policy in policies:
        row = [cell_text(table[b].get(policy), value) for b in bandits]
        lines.append(f"| {policy} | " + " | ".join(row) + " |")
    return [*lines, ""]


def markdown(table: dict[str, dict[str, Cell]], title: str, preamble: str = "") -> str:
    """The report as Markdown tables."""
    bandits = sorted(table)
    policies = list(mean_ranks(table))
    lines = [f"# {title}", "", preamble, ""]

    def grid(heading: str, value: str) -> None:
        lines.extend(grid_lines(table, heading, value, policies))

    grid("Runs behind each cell: seeds x rounds", "runs")
    if any(c.preset for cells in table.values() for c in cells.values()):
        grid(
            "ROFU preset each cell ran (rofu/models/presets.py; where the protocol names a "
            "learner, the learner, rofu/replay/simulation/learners.py; - for other policies)",
            "preset",
        )
    if any(c.source for cells in table.values() for c in cells.values()):
        grid("Report each cell is taken from", "source")
    grid("Final cumulative pseudo-regret, mean +- s.e.m.", "raw")
    if any(not math.isnan(c.regret2_mean) for cells in table.values() for c in cells.values()):
        grid(REGRET2_HEADING, "regret2")
    grid("Normalised to the best policy of each data set (paper convention)", "normalised")
    grid("Relative to Uniform = 100 (Showdown convention)", "relative_uniform")
    against = reference_of(p for cells in table.values() for p in cells)
    grid(f"Paired Wilcoxon signed-rank p-value against {against}", "wilcoxon_p")
    grid(f"The same, Holm-adjusted over each data set's tests against {against}", "wilcoxon_holm")
    grid("Wall time per round (ms; select + update, on this machine)", "time")
    if any(
        not math.isnan(c.cpu_seconds_per_round) for cells in table.values() for c in cells.values()
    ):
        lines.extend(_cpu_grid(table, bandits, policies))
    lines.extend(rank_lines(table, "Over the data sets each policy ran on (1 = best)"))
    return "\n".join(lines) + "\n"


def rank_lines(table: dict[str, dict[str, Cell]], heading: str) -> list[str]:
    """Each policy's mean rank and mean normalised regret over the data sets it ran on."""
    normalised = mean_normalised(table)
    return [
        f"## {heading}",
        "",
        "| policy | mean rank | mean normalised regret |",
        "|---|---|---|",
        *(f"| {p} | {r:.2f} | {fmt(normalised[p])} |" for p, r in mean_ranks(table).items()),
    ]


def _cpu_grid(
    table: dict[str, dict[str, Cell]], bandits: list[str], policies: list[str]
) -> list[str]:
    """The paper's running-time table: CPU seconds per PAPER_ROUNDS rounds per data set,
    their mean over the data sets, that mean over Greedy's on the same data sets, and the
    median over (data set, seed) of each run's CPU time over Greedy's run of the same seed.

    The last is the figure to trust on a shared host: a seed's runs of every policy run
    close together, so a host that is slower for a while slows both sides of its ratio.
    """
    lines = [
        f"## CPU seconds per {PAPER_ROUNDS:,} rounds (select + update; one core when each "
        "worker has one torch thread; the paper's running-time table)",
        "",
        "| policy | "
        + " | ".join(bandits)
        + " | mean | mean / Greedy's | median of run / Greedy's same-seed run |",
        "|---|" + "---|" * (len(bandits) + 3),
    ]
    for policy in policies:
        row = [cell_text(table[b].get(policy), "cpu") for b in bandits]
        timed = [b for b in bandits if not math.isnan(_cpu(table[b].get(policy)))]
        mean = np.mean([_cpu(table[b][policy]) for b in timed]) if timed else math.nan
        greedy = [_cpu(table[b].get("Greedy")) for b in timed]
        ratio = mean / np.mean(greedy) if timed and not np.isnan(greedy).any() else math.nan
        paired = [r for b in bandits for r in same_seed_ratios(table[b], policy, "Greedy")]
        median = float(np.median(paired)) if paired else math.nan
        row += [fmt(float(mean), 0), fmt(float(ratio), 2), fmt(median, 2)]
        lines.append(f"| {policy} | " + " | ".join(row) + " |")
    return [*lines, ""]


def same_seed_ratios(cells: dict[str, Cell], policy: str, baseline: str) -> list[float]:
    """One data set's CPU time of `policy` over `baseline`'s, per seed both ran with a CPU
    time (empty when either cell is missing or has no per-seed CPU times)."""
    one, other = cells.get(policy), cells.get(baseline)
    if one is None or other is None or not one.cpu_per_seed or not other.cpu_per_seed:
        return []
    theirs = dict(zip(other.seeds, other.cpu_per_seed, strict=True))
    return [
        cpu / theirs[seed]
        for seed, cpu in zip(one.seeds, one.cpu_per_seed, strict=True)
        if theirs.get(seed, 0) > 0
    ]


def _cpu(cell: Cell | None) -> float:
    """A cell's CPU seconds per PAPER_ROUNDS rounds (NaN without a cell or a CPU time)."""
    return math.nan if cell is None else PAPER_ROUNDS * cell.cpu_seconds_per_round
