"""`rofu replay --combine`: one report from the `results.json` of several report folders.

Reports made before run summaries were committed keep only their `results.json`, so this
is how cells run at different times meet in one table: a later folder's cell replaces an
earlier one's, or merges with it over disjoint seeds, and normalised regret, ranks and
Wilcoxon tests are recomputed.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from rofu.replay.reports.paired import sem
from rofu.replay.reports.report import with_notes, write_files
from rofu.replay.reports.table import Cell, compare, markdown


def load_cells(folder: Path) -> dict[str, dict[str, Cell]]:
    """The cells of a written report (`folder/results.json`), per-run figures only."""
    path = folder / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no report at {path}")
    try:
        document = json.loads(path.read_text())
        return {
            bandit: {policy: _cell(raw) for policy, raw in cells.items()}
            for bandit, cells in document["cells"].items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a replay report: {exc}") from exc


# A cell's own figures; the others are recomputed (or, `source`, set) by `combine`.
_DERIVED = {"normalised", "relative_uniform", "rank", "wilcoxon_p", "wilcoxon_holm", "source"}
_OWN = {f.name for f in fields(Cell)} - _DERIVED


def _cell(raw: dict[str, Any]) -> Cell:
    """A cell's own figures from JSON (null back to NaN)."""
    values: dict[str, Any] = {k: math.nan if v is None else v for k, v in raw.items() if k in _OWN}
    return Cell(**values)


def combine(
    folders: list[Path],
    out: Path,
    title: str,
    preamble: str = "",
    policies: tuple[str, ...] | None = None,
    datasets: tuple[str, ...] | None = None,
) -> Path:
    """One report from several written reports. For the same data set and policy a later
    folder's cell replaces an earlier folder's, unless the two ran disjoint seeds and both
    kept per-seed finals: then they merge into one cell over all their seeds (more seeds
    of the same setting, run at different times). Writes README.md and results.json into
    `out` (no curves: the runs stay with their own reports).

    Cells of one data set must share T, or normalising them would compare unlike things.
    """
    table: dict[str, dict[str, Cell]] = {}
    for folder in folders:
        for bandit, cells in load_cells(folder).items():
            if datasets is not None and bandit not in datasets:
                continue
            for policy, cell in cells.items():
                if policies is None or policy in policies:
                    cell = replace(cell, source=str(folder))
                    row = table.setdefault(bandit, {})
                    row[policy] = _merged(row[policy], cell) if policy in row else cell
    if not table:
        raise ValueError("the folders hold no cell for these data sets and policies")
    for bandit, cells in table.items():
        rounds = {c.rounds for c in cells.values()}
        if len(rounds) > 1:
            raise ValueError(
                f"{bandit}: cells with different T {sorted(rounds)} cannot be compared"
            )
    table = {b: compare(cells) for b, cells in sorted(table.items())}
    preamble = with_notes(out, preamble)
    return write_files(out, title, table, markdown(table, title, preamble))


def _merged(earlier: Cell, later: Cell) -> Cell:
    """`later` alone, or both cells as one when their seeds are disjoint and both have finals.

    Exact: the mean, s.e.m. and test come from the per-seed finals; the realised regret and
    the time per round are means over seeds, so they merge weighted by seed count.
    """
    mergeable = earlier.has_finals and later.has_finals and earlier.rounds == later.rounds
    if not mergeable or set(earlier.seeds) & set(later.seeds):
        return later
    by_seed = dict(zip(earlier.seeds + later.seeds, earlier.finals + later.finals, strict=True))
    seeds = sorted(by_seed)
    finals = np.array([by_seed[s] for s in seeds])
    cpu_by_seed = (
        dict(
            zip(earlier.seeds + later.seeds, earlier.cpu_per_seed + later.cpu_per_seed, strict=True)
        )
        if earlier.cpu_per_seed and later.cpu_per_seed
        else {}
    )
    counts = np.array([len(earlier.seeds), len(later.seeds)])

    def weighted(figure: str) -> float:
        return float(np.average([getattr(earlier, figure), getattr(later, figure)], weights=counts))

    return Cell(
        mean=float(finals.mean()),
        sem=sem(finals),
        realised_mean=weighted("realised_mean"),
        seeds=seeds,
        rounds=later.rounds,
        seconds_per_round=weighted("seconds_per_round"),
        cpu_seconds_per_round=weighted("cpu_seconds_per_round"),
        finals=[float(v) for v in finals],
        cpu_per_seed=[cpu_by_seed[s] for s in seeds] if cpu_by_seed else [],
        source=f"{earlier.source} + {later.source}",
    )
