"""`rofu ope`: off-policy estimates of named policies on one Open Bandit Dataset log
(`rofu.replay.ope`), written as `ope_<behavior>_<campaign>.md` and `.json`."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rofu.models.validation import check_choice, check_int
from rofu.replay.arguments import DEFAULT_OUT, parse_names
from rofu.replay.ope import ESTIMATORS, Estimate, behavior_value, evaluate
from rofu.replay.simulation.obd import POLICY_NOTES, default_policies, load_obd


def run_ope(
    policies: list[str],
    behavior: str,
    campaign: str,
    data_dir: Path | str | None,
    seed: int,
    out_dir: Path | str,
    *,
    rows: int | None = None,
    ci: str = "normal",
) -> dict[str, Any]:
    """Evaluate named default policies on one OBD log; write `ope_{behavior}_{campaign}.md/.json`.

    Args:
        policies: names from `default_policies` (empty: all of them).
        rows: keep only the first `rows` rows in time order (None: all).
        The rest as in `load_obd` and `evaluate`.

    Returns:
        The figures written to the JSON file.
    """
    registry = default_policies(seed)
    for name in policies:
        check_choice("policies", name, registry)
    logged = load_obd(behavior, campaign, data_dir)  # type: ignore[arg-type]
    logged = logged if rows is None else logged.head(check_int("rows", rows, low=1))
    figures: dict[str, Any] = {
        "log": logged.name,
        "rows": len(logged),
        "n_items": logged.n_items,
        "context_dim": logged.context_dim,
        "uniform_log": logged.uniform,
        "seed": seed,
        "ci": ci,
        "behavior_value": _jsonable(behavior_value(logged, ci=ci)),
        "policies": {},
        "seconds": {},
    }
    names = policies or list(registry)
    print(f"rofu ope: {logged.name}, {len(logged)} rows, {len(names)} policies", file=sys.stderr)
    for i, name in enumerate(names, 1):
        began = time.perf_counter()
        print(f"rofu ope: [{i}/{len(names)}] {name} ...", end="", file=sys.stderr, flush=True)
        result = evaluate({name: registry[name]}, logged, ci=ci, seed=seed)[name]
        figures["seconds"][name] = round(time.perf_counter() - began, 2)
        print(f" {figures['seconds'][name]:.1f} s", file=sys.stderr)
        figures["policies"][name] = {k: _jsonable(v) for k, v in result.items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"ope_{behavior}_{campaign}"
    stem.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(figures))
    return figures


def _jsonable(estimate: Estimate) -> dict[str, Any]:
    return {
        k: None if isinstance(v, float) and math.isnan(v) else v
        for k, v in asdict(estimate).items()
    }


def markdown(figures: dict[str, Any]) -> str:
    """The estimator x policy table of `run_ope`'s figures."""
    names = [e for e in ESTIMATORS if any(e in p for p in figures["policies"].values())]
    lines = [
        f"# Off-policy evaluation on {figures['log']}",
        "",
        f"{figures['rows']} rows, {figures['n_items']} items, D = {figures['context_dim']}, "
        f"seed {figures['seed']}, 95% CI ({figures['ci']}). Logged policy (on-policy mean "
        f"click): {_cell(figures['behavior_value'])}.",
        "",
        "| policy | " + " | ".join(names) + " | matched rows | matched clicks | seconds |",
        "|---|" + "---|" * (len(names) + 3),
    ]
    for policy, result in figures["policies"].items():
        first = next(iter(result.values()))
        cells = [_cell(result[e]) for e in names]
        lines.append(
            f"| {policy} | " + " | ".join(cells) + f" | {first['n_matched']} | "
            f"{first['matched_reward']:g} | {figures['seconds'][policy]} |"
        )
    lines += [
        "",
        "Each policy streams the log once in time order and learns only from the rows where "
        "it chose the logged item (matched rows).",
    ]
    if "replay" not in names:
        lines.append("replay: not computed, the log is not uniform-random.")
    if any(next(iter(r.values()))["matched_reward"] == 0 for r in figures["policies"].values()):
        lines.append(
            "With no matched click, replay and IPS are 0 with a collapsed interval; the rule "
            "of three bounds such a replay value by 3 / matched rows."
        )
    lines += [f"- {p}: {POLICY_NOTES[p]}" for p in figures["policies"] if p in POLICY_NOTES]
    return "\n".join(lines) + "\n"


def _cell(estimate: dict[str, Any]) -> str:
    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.5f}"

    return f"{fmt(estimate['value'])} [{fmt(estimate['ci_low'])}, {fmt(estimate['ci_high'])}]"


def build_ope_parser() -> argparse.ArgumentParser:
    """The parser of `rofu ope`."""
    parser = argparse.ArgumentParser(
        prog="rofu ope",
        description="Replay (Li et al. 2011), IPS and DR estimates of each policy's value on "
        "the Open Bandit Dataset sample, with 95% confidence intervals.",
    )
    parser.add_argument(
        "--behavior",
        choices=("random", "bts"),
        default="random",
        help="the logged policy (replay needs the uniform-random log)",
    )
    parser.add_argument(
        "--campaign",
        choices=("all", "men", "women"),
        default="all",
        help="the Open Bandit Dataset campaign (default all)",
    )
    parser.add_argument(
        "--policies",
        type=parse_names,
        default=(),
        help="comma-separated (default: Uniform, EpsilonGreedy, LinUCB, ROFU)",
    )
    parser.add_argument("--rows", type=int, help="only the first N logged rows")
    parser.add_argument(
        "--ci",
        choices=("normal", "bootstrap"),
        default="normal",
        help="95%% intervals by the normal approximation or the bootstrap (default normal)",
    )
    parser.add_argument("--seed", type=int, default=0, help="DR's folds and the bootstrap")
    parser.add_argument("--data-dir", type=Path, help="benchmark data (default ROFU_DATA_DIR)")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT / "ope", help=f"default {DEFAULT_OUT / 'ope'}"
    )
    return parser


def ope_main(argv: list[str] | None = None) -> int:
    """Entry point of `rofu ope`: off-policy estimates on the Open Bandit Dataset sample."""
    args = build_ope_parser().parse_args(argv)
    run_ope(
        list(args.policies),
        args.behavior,
        args.campaign,
        args.data_dir,
        args.seed,
        args.out,
        rows=args.rows,
        ci=args.ci,
    )
    print(args.out / f"ope_{args.behavior}_{args.campaign}.md")
    return 0
