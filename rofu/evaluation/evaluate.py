"""`rofu evaluate`: what other policies would have earned on the service's own log.

The log (rewarded decisions, with their logged probabilities) is read through the export
reader; each target policy is a (N, S) table of exact choice probabilities on the logged
contexts and candidates, computed with the service's own rule (`rofu.models.selection`):

- `served`: the served checkpoint (the pinned one, else the newest), scored as the
  service scores it (`rofu.service.log.service_log.score_checkpoint`) under the ROFU
  configuration the checkpoint recorded (`rofu.evaluation.recorded`: estimator, bonus
  scale, selection rule, floor, igw gamma), not this shell's settings;
- the served model with other exploration settings: other exploration floors, other
  bonus scales (multiples of the recorded one);
- `greedy`: the served model's mean alone (argmax, ties uniform);
- `uniform`: every candidate alike;
- older stored checkpoints, each under its own record (default: the one before the
  served one).

A request that asked not to explore keeps its argmax of the mean under every rule, as
the service would answer it.

Rows: each checkpoint's policies are estimated on the rows fresh for that checkpoint
(`rofu.service.log.fresh`: decided after it was stored, consumed by no training of it or
an earlier version), since on the rows it was fitted on its choices look better than
they are; uniform and the logged value on the served checkpoint's fresh rows, so that
the served policy, its variations, uniform and the logged one are compared on the same
rows. With `include_training_rows` every row of the window is used, and the report's
first line says the estimates are optimistic and how many rows the served checkpoint
was fitted on. A served checkpoint with no fresh row is an `EvaluationError`.

Each policy's value is estimated by IPS, SNIPS and DR (`rofu.replay.ope`) with 95%
intervals, where the log supports it (`rofu.evaluation.estimates`: at least
`MIN_SUPPORT` of its choices on arms the logging rule gave a positive probability), and
always by the direct method under the reward model (DM); the reward model is a ridge
regression per arm on [context, 1], cross-fitted over two folds of the window's rows so
that no row's prediction saw its own reward.

On decisions whose request carried the app's own `baseline_arm` (apprentice mode, or
recorded in online mode), every policy, on its rows, and rofu's own rule as logged (by
model version, on every row: each was decided by a model that had not seen it), is also
compared with that baseline (`rofu.evaluation.baseline`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rofu.evaluation.baseline import compare_with_baseline
from rofu.evaluation.estimates import MIN_SUPPORT, estimate, logged_value
from rofu.evaluation.estimates import ridge_rewards as ridge_rewards  # DR's model, re-exported
from rofu.evaluation.policies import Plan, TargetPolicy, Variations, target_policies
from rofu.evaluation.report import write_report
from rofu.service.db.engine import MissingDatabase, existing_engine, session_factory
from rofu.service.errors import ServiceError
from rofu.service.log.fresh import fresh_rows, seen_rows, span
from rofu.service.log.pages import EVERYTHING, Window, utc
from rofu.service.log.service_log import EvaluationError, ServiceLog, read_service_log
from rofu.service.settings import Settings

DEFAULT_OUT = Path("results") / "tmp" / "evaluate"
DEFAULT_VARIATIONS = Variations()


def _refit(log: ServiceLog, seed: int) -> np.ndarray:
    return ridge_rewards(log, seed=seed)


def policy_figures(
    policy: TargetPolicy,
    log: ServiceLog,
    q: np.ndarray,
    *,
    ci: str = "normal",
    seed: int = 0,
    min_support: float = MIN_SUPPORT,
) -> dict[str, Any]:
    """One policy's entry of the report: what it is, its rows (how many, first and last
    decision time, how many its checkpoint was fitted on), its support and estimates."""
    rows, v = policy.rows, policy.checkpoint
    figures: dict[str, Any] = {
        "note": policy.note,
        "checkpoint": v,
        "config": None if policy.config is None else policy.config.figures(),
        **span(log, rows),
        "fitted_on": 0 if v is None else int((seen_rows(log, v) & rows).sum()),
    }
    part = log.subset(rows)
    probabilities = policy.probabilities[rows]
    return figures | estimate(
        probabilities, part, q[rows], ci=ci, seed=seed, min_support=min_support
    )


def optimistic_line(plan: Plan, log: ServiceLog) -> str | None:
    """The report's first line when every row of the window was used; None without a
    served checkpoint (no model was fitted on any row)."""
    if plan.served is None:
        return None
    v = plan.served.version
    fitted = seen_rows(log, v)
    before = ~fresh_rows(log, v, plan.served.created_at) & ~fitted
    return (
        f"Optimistic: --include-training-rows evaluates on every row of the window, and the "
        f"served checkpoint v{v} was fitted on {int(fitted.sum())} of these {len(log)} rows "
        f"({int(before.sum())} others were decided before it was stored): the estimates of "
        "the policies built on it are optimistic."
    )


def served_figures(plan: Plan) -> dict[str, Any] | None:
    """The served checkpoint: its version, when it was stored, the configuration it is
    scored under and how far that is from what its service logged."""
    if plan.served is None or plan.served_config is None:
        return None
    return {
        "version": plan.served.version,
        "created_at": plan.served.created_at.isoformat(),
        "config": plan.served_config.figures(),
        "mismatch": plan.mismatch,
    }


def run_evaluation(
    settings: Settings,
    window: Window = EVERYTHING,
    variations: Variations = DEFAULT_VARIATIONS,
    *,
    ci: str = "normal",
    seed: int = 0,
    out_dir: Path = DEFAULT_OUT,
    include_training_rows: bool = False,
    min_support: float = MIN_SUPPORT,
) -> dict[str, Any]:
    """Evaluate the target policies on the window's log; write evaluate.md/.json/.png.

    Returns:
        The figures written to evaluate.json.

    Raises:
        EvaluationError: the window holds no rewarded decision, none fresh for the served
            checkpoint (unless `include_training_rows`), or that checkpoint cannot be read.
    """
    engine = existing_engine(settings.database_url)
    try:
        sessions = session_factory(engine)
        log = read_service_log(sessions, window, settings.default_reward)
        plan = target_policies(
            settings, sessions, log, variations, everything=include_training_rows
        )
    finally:
        engine.dispose()
    q = ridge_rewards(log, seed=seed)
    results = {
        p.name: policy_figures(p, log, q, ci=ci, seed=seed, min_support=min_support)
        for p in plan.policies
    }
    optimistic = optimistic_line(plan, log) if include_training_rows else None
    figures: dict[str, Any] = {
        "optimistic": optimistic,
        **log_figures(log, window),
        "include_training_rows": include_training_rows,
        "min_support": min_support,
        "ci": ci,
        "seed": seed,
        "served": served_figures(plan),
        "reference": span(log, plan.reference),
        "logged": logged_value(log.subset(plan.reference), ci=ci),
        "policies": results,
        "baseline": baseline_figures(plan, log, q, seed),
        "notes": plan.notes,
    }
    return write_report(figures, out_dir)


def log_figures(log: ServiceLog, window: Window) -> dict[str, Any]:
    """What the window (--since/--until) holds."""
    return {
        "rows": len(log),
        "unrewarded": log.unrewarded,
        "unactivated": log.unactivated,
        "since": None if window.since is None else window.since.isoformat(),
        "until": None if window.until is None else window.until.isoformat(),
        "logged_versions": sorted({int(v) for v in log.versions}),
    }


def baseline_figures(
    plan: Plan, log: ServiceLog, q: np.ndarray, seed: int
) -> dict[str, Any] | None:
    """The comparison with the app's baseline, each policy on its rows."""
    return compare_with_baseline(
        log,
        q,
        {p.name: p.probabilities for p in plan.policies},
        {p.name: p.rows for p in plan.policies},
        plan.reference,
        _refit,
        seed=seed,
    )


def _summary(figures: dict[str, Any]) -> str:
    rows = f"{figures['rows']} rewarded decisions"
    if figures["served"] is None:
        return f"{rows}, no checkpoint stored"
    if figures["include_training_rows"]:
        return f"{rows}, all used (optimistic)"
    return f"{rows}, {figures['reference']['rows']} of them fresh for the served checkpoint"


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: a share in [0, 1]")
    return value


def _numbers(kind: type[float] | type[int], low: float = 0.0, high: float = math.inf) -> Any:
    def parse(text: str) -> tuple[float | int, ...]:
        try:
            numbers = tuple(kind(part) for part in text.split(",") if part.strip())
        except ValueError:
            numbers = (math.nan,)
        if not all(low <= n <= high for n in numbers):
            raise argparse.ArgumentTypeError(f"{text!r}: numbers in [{low:g}, {high:g}], by commas")
        return numbers

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The parser of `rofu evaluate`."""
    from rofu.service.cli import moment

    parser = argparse.ArgumentParser(
        prog="rofu evaluate",
        description="IPS, SNIPS, DR and reward-model (DM) estimates (95% intervals) of the "
        "served model under the configuration its checkpoint recorded, other exploration "
        "settings, greedy, uniform and older checkpoints on the service's own decision log "
        "(ROFU_DATABASE_URL), each checkpoint on the decisions it has not seen, each also "
        "against the app's own baseline_arm where requests carried one (apprentice mode); "
        "writes evaluate.md, .json and .png.",
    )
    parser.add_argument("--since", type=moment, help="decisions made at this time or later")
    parser.add_argument("--until", type=moment, help="decisions made before this time")
    parser.add_argument(
        "--floors",
        type=_numbers(float, high=1.0),
        default=Variations.floors,
        help="other exploration floors for the served model (default 0.05,0.2)",
    )
    parser.add_argument(
        "--bonus-scales",
        type=_numbers(float),
        default=Variations.bonus_scales,
        help="multiples of the served bonus (default 0.5,2)",
    )
    parser.add_argument(
        "--checkpoints",
        type=_numbers(int, low=1),
        help="stored versions to replay (default: the one before the served one)",
    )
    parser.add_argument(
        "--ci",
        choices=("normal", "bootstrap"),
        default="normal",
        help="95%% intervals by the normal approximation or the bootstrap (default normal)",
    )
    parser.add_argument(
        "--include-training-rows",
        action="store_true",
        help="evaluate every policy on every decision of the window, those its checkpoint "
        "was fitted on included (optimistic; default: each checkpoint on the decisions made "
        "after it was stored and not consumed by its training)",
    )
    parser.add_argument(
        "--min-support",
        type=_fraction,
        default=MIN_SUPPORT,
        help="refuse IPS, SNIPS and DR for a policy with a smaller share of its choices on "
        f"arms the log gave a positive probability (default {MIN_SUPPORT:g})",
    )
    parser.add_argument("--seed", type=int, default=0, help="DR's folds and the bootstrap")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `rofu evaluate`."""
    from rofu.service.settings import get_settings

    args = build_parser().parse_args(argv)
    variations = Variations(args.floors, args.bonus_scales, args.checkpoints)
    try:
        window = Window(*(None if m is None else utc(m) for m in (args.since, args.until)))
        figures = run_evaluation(
            get_settings(),
            window,
            variations,
            ci=args.ci,
            seed=args.seed,
            out_dir=args.out,
            include_training_rows=args.include_training_rows,
            min_support=args.min_support,
        )
    except MissingDatabase as exc:
        print(f"rofu evaluate: {exc}", file=sys.stderr)
        return 2
    except (EvaluationError, ServiceError) as exc:
        print(f"rofu evaluate: {exc}", file=sys.stderr)
        return 1
    print(f"rofu evaluate: {_summary(figures)}", file=sys.stderr)
    print(args.out / "evaluate.md")
    return 0
