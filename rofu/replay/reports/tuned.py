"""The paper protocol's second table: ROFU on each data set's tuned preset.

The headline runs ROFU on one preset everywhere but Mushroom, as the paper did. Where the
Showdown's data sets have tuned presets of their own (`TUNED_PRESETS`), `ROFU-tuned` runs
them beside it, on the same seeds; where a data set has none, or ROFU already runs it,
ROFU's own runs are its cell (the same configuration repeats them bit for bit). This
module keeps `ROFU-tuned` out of the headline's tables, where it would shift the other
policies' ranks and the best-policy normalisation, and writes the second table: the
headline's with ROFU's runs replaced by ROFU-tuned's, each ROFU cell naming its preset,
and beside it the two ROFU cells of every data set.
"""

from __future__ import annotations

from rofu.replay.reports.paired import REFERENCE, paired_wilcoxon
from rofu.replay.reports.table import (
    Cell,
    cell_text,
    fmt,
    grid_lines,
    mean_ranks,
    rank_lines,
    summarise,
)
from rofu.replay.simulation.policies import TUNED_POLICY
from rofu.replay.simulation.summary import RunSummary

Results = dict[str, dict[str, list[RunSummary]]]
Table = dict[str, dict[str, Cell]]


def split(results: Results) -> tuple[Results, Results]:
    """(the headline's runs, without ROFU-tuned; the same with ROFU's runs replaced by
    ROFU-tuned's where it ran). The second is empty when ROFU-tuned never ran."""
    headline = {
        bandit: {p: runs for p, runs in by_policy.items() if p != TUNED_POLICY}
        for bandit, by_policy in results.items()
    }
    if not any(TUNED_POLICY in by_policy for by_policy in results.values()):
        return headline, {}
    tuned = {
        bandit: dict(by_policy) | _as_rofu(results[bandit].get(TUNED_POLICY))
        for bandit, by_policy in headline.items()
    }
    return headline, tuned


def _as_rofu(runs: list[RunSummary] | None) -> dict[str, list[RunSummary]]:
    return {} if runs is None else {REFERENCE: runs}


def section(headline: Table, tuned: Table, results: Results) -> str:
    """The second table and the two ROFU cells side by side (Markdown)."""
    lines = [
        "## ROFU on one preset and on each data set's tuned preset",
        "",
        f"`{TUNED_POLICY}` runs each data set's tuned preset (`TUNED_PRESETS` in "
        "rofu/replay/simulation/policies.py, frozen on tuning seeds) on the headline's seeds, "
        "where it differs from the preset ROFU runs there; elsewhere ROFU's own runs are its cell. "
        "The tables above leave it out; the ones below are the headline's with ROFU's runs "
        "replaced by ROFU-tuned's, ranks, normalisation and tests recomputed.",
        "",
        "| data set | ROFU: preset | final regret | ROFU-tuned: preset | final regret | "
        "tuned / one | Wilcoxon p | CPU s per 20,000 rounds (one, tuned) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for bandit in sorted(headline):
        lines.append(_pair_row(bandit, headline[bandit].get(REFERENCE), results[bandit]))
    policies = list(mean_ranks(tuned))
    lines += [""]
    lines += grid_lines(tuned, "Per-data-set presets: runs behind each cell", "runs", policies)
    lines += grid_lines(
        tuned, "Per-data-set presets: final cumulative pseudo-regret", "raw+preset", policies
    )
    lines += grid_lines(
        tuned, "Per-data-set presets: normalised to the best policy", "normalised", policies
    )
    lines += grid_lines(
        tuned,
        f"Per-data-set presets: Holm-adjusted Wilcoxon p against {REFERENCE}",
        "wilcoxon_holm",
        policies,
    )
    lines += rank_lines(tuned, "Per-data-set presets: over the data sets each policy ran on")
    return "\n".join(lines) + "\n"


def _pair_row(bandit: str, one: Cell | None, by_policy: dict[str, list[RunSummary]]) -> str:
    """One data set's ROFU cell beside ROFU-tuned's (ROFU's own where it did not run)."""
    tuned_runs = by_policy.get(TUNED_POLICY)
    if one is None:
        return f"| {bandit} | - | - | - | - | - | - | - |"
    if tuned_runs is None:  # no tuned preset of its own, or ROFU's: ROFU's runs
        raw, cpu = cell_text(one, "raw"), cell_text(one, "cpu")
        return f"| {bandit} | `{one.preset}` | {raw} | ROFU's runs | {raw} | 1 | - | {cpu} |"
    tuned = summarise({bandit: {TUNED_POLICY: tuned_runs}})[bandit][TUNED_POLICY]
    p = paired_wilcoxon(
        dict(zip(tuned.seeds, tuned.finals, strict=True)),
        dict(zip(one.seeds, one.finals, strict=True)),
    )
    return (
        f"| {bandit} | `{one.preset}` | {cell_text(one, 'raw')} | `{tuned.preset}` | "
        f"{cell_text(tuned, 'raw')} | {fmt(tuned.mean / one.mean, 3)} | {fmt(p, 3)} | "
        f"{cell_text(one, 'cpu')}, {cell_text(tuned, 'cpu')} |"
    )
