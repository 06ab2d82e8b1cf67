"""The replay report: statistics over seeds, tables, regret and bonus curves; Markdown + JSON
+ PNG.

Main figure: final cumulative pseudo-regret (expected regret against each round's best
arm) after T rounds, mean +- s.e.m. over seeds; also normalised to the best policy of each
data set (the ROFU paper's convention) and relative to Uniform = 100 (the Showdown's),
the mean rank over data sets, paired Wilcoxon signed-rank tests of every policy against
ROFU over the same seeds (and their Holm-adjusted p-values, per data set over the policies
compared), and the CPU time per round where the runs recorded it.

`rofu.replay.reports.combine` builds one report from the `results.json` of several such reports.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from rofu.replay.reports import bonus, curves, tuned
from rofu.replay.reports.table import Cell, markdown, mean_normalised, mean_ranks, summarise
from rofu.replay.runs import EVERY_RUN, Selection, collect

NOTES = "NOTES.md"


def report_title(protocol: str, data_file: Path | None = None) -> str:
    """A report's title: the data set file's name when one ran (`--dataset-file`), else
    the protocol's."""
    return f"Replay report: {protocol if data_file is None else data_file.name}"


def write_report(
    out: Path,
    title: str,
    preamble: str = "",
    rounds: int | None = None,
    only: Selection = EVERY_RUN,
) -> Path:
    """Collect (the runs `only` admits), summarise and write README.md, results.json,
    regret PNGs and, where runs recorded an exploration bonus, bonus PNGs
    (`rofu.replay.reports.bonus`)
    into `out`.

    A hand-written `out/NOTES.md` (what the figures say) goes in after the preamble, so
    rebuilding the report keeps it.
    """
    results = collect(out, rounds, only)
    if not results:
        raise FileNotFoundError(f"no runs{only.describe()} under {out / 'runs'}")
    preamble = with_notes(out, preamble)
    headline, with_tuned = tuned.split(results)  # ROFU-tuned has a table of its own
    table = summarise(headline)
    tuned_table = summarise(with_tuned) if with_tuned else None
    plots = curves.plot_regret(results, out / "plots")
    text = markdown(table, title, preamble)
    if tuned_table is not None:
        text += "\n" + tuned.section(table, tuned_table, results)
    text += "\n## Regret curves\n\n" + _images(plots)
    bonus_plots = curves.plot_bonus(results, out / "plots")
    if bonus_plots:
        table_text = bonus.markdown_table(results)
        text += "\n## Bonus curves\n\n" + table_text + "\n" + _images(bonus_plots)
    steps = bonus.step_table(results)
    if steps:
        text += "\n## Ascent step and the stability cap\n\n" + steps
    return write_files(out, title, table, text, tuned_table)


def _images(paths: list[Path]) -> str:
    return "\n".join(f"![{p.stem}](plots/{p.name})" for p in paths) + "\n"


def with_notes(out: Path, preamble: str) -> str:
    notes = out / NOTES
    if not notes.is_file():
        return preamble
    return f"{preamble}\n\n{notes.read_text(encoding='utf-8').strip()}"


def write_files(
    out: Path,
    title: str,
    table: dict[str, dict[str, Cell]],
    text: str,
    tuned: dict[str, dict[str, Cell]] | None = None,
) -> Path:
    """README.md and results.json; `tuned`: the table with ROFU on per-data-set presets."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(text)
    document = _document(title, table)
    if tuned is not None:
        document["per_data_set_presets"] = _document(title, tuned)
    (out / "results.json").write_text(json.dumps(json_safe(document), indent=2))
    return out / "README.md"


def _document(title: str, table: dict[str, dict[str, Cell]]) -> dict[str, object]:
    return {
        "title": title,
        "mean_rank": mean_ranks(table),
        "mean_normalised": mean_normalised(table),
        "cells": {b: {p: asdict(c) for p, c in cells.items()} for b, cells in table.items()},
    }


def json_safe(value: object) -> object:
    """NaN and infinities become null (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
