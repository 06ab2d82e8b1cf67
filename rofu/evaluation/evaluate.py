"""`rofu evaluate`: what other policies would have earned on the service's own log.

The log (rewarded decisions, with their logged propensities) is read through the export
reader; each target policy is a (N, S) table of exact choice probabilities on the logged
contexts and candidates, computed with the service's own rule (`rofu.models.selection`):

- `served`: the served checkpoint (the pinned one, else the newest), scored as the
  service scores (`rofu.evaluation.service_log.checkpoint_scores`), under the configured rule;
- the served model with other exploration settings: other exploration floors, other
  bonus scales;
- `greedy`: the served model's mean alone (argmax, ties uniform);
- `uniform`: every candidate alike;
- older stored checkpoints under the configured rule (default: the one before the
  served one).

A request that asked not to explore keeps its argmax of the mean under every rule, as
the service would answer it. Each policy's value is estimated by IPS, SNIPS and DR
(`rofu.replay.ope`, with pi(a_i | x_i) in place of the match indicator) with 95% intervals;
DR's reward model is a ridge regression per arm on [context, 1], cross-fitted over two
folds of rows so no row's prediction saw its own reward. IPS and DR are unbiased only
where the logging rule gave the target's arms a positive probability: `off_support` is
the target's mean probability mass on arms the logged probabilities gave 0.

On decisions whose request carried the app's own `baseline_arm` (apprentice mode, or
recorded in online mode), every policy, and rofu's own rule as logged (by model
version), is also compared with that baseline (`rofu.evaluation.baseline`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rofu.evaluation.baseline import compare_with_baseline
from rofu.evaluation.report import write_report
from rofu.evaluation.service_log import (
    CheckpointScores,
    EvaluationError,
    ServiceLog,
    checkpoint_scores,
    read_service_log,
)
from rofu.models.selection import ARGMAX, SelectionRule, choice_probabilities
from rofu.replay.ope import Estimate, dr_estimate, ips_estimate, ratio_estimate, snips_estimate
from rofu.service.db import repository
from rofu.service.db.engine import (
    MissingDatabase,
    SessionFactory,
    existing_engine,
    session_factory,
)
from rofu.service.errors import ServiceError
from rofu.service.log.pages import EVERYTHING, Window, utc
from rofu.service.settings import Settings

DEFAULT_OUT = Path("results") / "tmp" / "evaluate"


@dataclass(frozen=True)
class TargetPolicy:
    """A policy to evaluate: its (N, S) choice probabilities on the log, and what it is."""

    name: str
    probabilities: np.ndarray
    note: str


@dataclass(frozen=True)
class Variations:
    """The alternatives to the served policy to evaluate.

    Attributes:
        floors: other exploration floors under the served model.
        bonus_scales: multiples of the served bonus (ROFU_BONUS_SCALE x this).
        checkpoints: stored versions to replay (None: the one before the served one).
    """

    floors: tuple[float, ...] = (0.05, 0.2)
    bonus_scales: tuple[float, ...] = (0.5, 2.0)
    checkpoints: tuple[int, ...] | None = None


def rule_probabilities(
    scores: CheckpointScores, log: ServiceLog, rule: SelectionRule, bonus_scale: float = 1.0
) -> np.ndarray:
    """(N, S) probabilities of `rule` over mean + bonus_scale * bonus (the mean alone
    for a request that asked not to explore)."""
    explore = log.explore[:, None]
    values = np.where(explore, scores.mean + bonus_scale * scores.bonus, scores.mean)
    chosen = choice_probabilities(
        torch.from_numpy(values),
        torch.from_numpy(log.candidates),
        rule,
        torch.from_numpy(log.explore),
    )
    return chosen.numpy()


def uniform_probabilities(log: ServiceLog) -> np.ndarray:
    """(N, S) uniform over each decision's candidates."""
    counts = log.candidates.sum(axis=1, keepdims=True)
    uniform: np.ndarray = log.candidates / counts
    return uniform


def target_policies(
    settings: Settings,
    sessions: SessionFactory,
    log: ServiceLog,
    variations: Variations,
    notes: list[str],
) -> Iterator[TargetPolicy]:
    """The policies to evaluate, one (N, S) table at a time; why a policy could not be
    built is appended to `notes`."""
    rule = settings.rofu_config().rule
    yield TargetPolicy("uniform", uniform_probabilities(log), "every candidate alike")
    try:
        served = checkpoint_scores(settings, sessions, log, repository.get_pin(sessions))
    except EvaluationError as exc:
        notes.append(f"served model: {exc}")
        return
    v = served.version
    yield TargetPolicy(f"served v{v}", rule_probabilities(served, log, rule), _describe(rule))
    yield TargetPolicy(f"greedy v{v}", rule_probabilities(served, log, ARGMAX, 0.0), "mean only")
    for floor in variations.floors:
        if floor != rule.exploration_floor:
            other = SelectionRule(rule.selection, floor, rule.igw_gamma)
            name = f"served v{v}, floor {floor:g}"
            yield TargetPolicy(name, rule_probabilities(served, log, other), "")
    for scale in variations.bonus_scales:
        probabilities = rule_probabilities(served, log, rule, scale)
        yield TargetPolicy(f"served v{v}, bonus x{scale:g}", probabilities, "")
    for version in _older(sessions, variations.checkpoints, v):
        try:
            old = checkpoint_scores(settings, sessions, log, version)
        except EvaluationError as exc:
            notes.append(str(exc))
            continue
        yield TargetPolicy(f"checkpoint v{version}", rule_probabilities(old, log, rule), "")


def _describe(rule: SelectionRule) -> str:
    igw = f", gamma {rule.igw_gamma:g}" if rule.selection == "igw" else ""
    return f"{rule.selection}{igw}, floor {rule.exploration_floor:g}"


def _older(sessions: SessionFactory, versions: tuple[int, ...] | None, served: int) -> list[int]:
    if versions is not None:
        return [v for v in versions if v != served]
    rows = repository.list_checkpoints(sessions, limit=20, before=served)
    return [row.version for row in rows if row.quarantined_at is None][:1]


def ridge_rewards(log: ServiceLog, *, l2: float = 1e-3, seed: int = 0) -> np.ndarray:
    """DR's reward model: (N, S) predictions of a ridge regression per arm on [x, 1],
    each row predicted by the fit on the other fold (the training mean for an arm that
    fold never chose). The ridge is small: shrinkage would bias what DR extrapolates to
    arms that have no logged reward (apprentice logs), which no correction term undoes."""
    phi = np.hstack([log.contexts, np.ones((len(log), 1))])  # (N, D + 1)
    fold = np.random.default_rng(seed).integers(2, size=len(log))  # (N,)
    q = np.zeros((len(log), log.n_slots))
    for k in range(2):
        train, test = fold != k, fold == k
        q[test] = log.rewards[train].mean() if train.any() else 0.0
        for slot in np.unique(log.actions[train]):
            rows = train & (log.actions == slot)
            gram = phi[rows].T @ phi[rows] + l2 * np.eye(phi.shape[1])
            weights = np.linalg.solve(gram, phi[rows].T @ log.rewards[rows])
            q[test, slot] = phi[test] @ weights
    return q


def _refit(log: ServiceLog, seed: int) -> np.ndarray:
    return ridge_rewards(log, seed=seed)


def estimate(
    probabilities: np.ndarray, log: ServiceLog, q: np.ndarray, *, ci: str = "normal", seed: int = 0
) -> dict[str, Any]:
    """IPS, SNIPS and DR of one target policy, with its effective sample size and the
    probability mass it puts where the logging rule could not go."""
    rows = np.arange(len(log))
    on_logged = probabilities[rows, log.actions]  # (N,) pi(a_i | x_i)
    r, p = log.rewards, log.propensities
    q_policy = np.nansum(probabilities * q, axis=1)  # (N,) sum_a pi(a | x) q(x, a)
    estimates: dict[str, Estimate] = {
        "ips": ips_estimate(r, on_logged, p, ci=ci, rng=np.random.default_rng(seed)),
        "snips": snips_estimate(r, on_logged, p, ci=ci, rng=np.random.default_rng(seed)),
        "dr": dr_estimate(
            r, on_logged, p, q[rows, log.actions], q_policy, ci=ci, rng=np.random.default_rng(seed)
        ),
    }
    weights = on_logged / p
    known = ~np.isnan(log.logging).any(axis=1)
    off = (probabilities * (log.logging == 0) * log.candidates).sum(axis=1)  # (N,)
    return {
        **estimates,
        "effective_rows": float(weights.sum() ** 2 / max(float(np.square(weights).sum()), 1e-300)),
        "off_support": float(off[known].mean()) if known.any() else None,
    }


def logged_value(log: ServiceLog, *, ci: str = "normal") -> Estimate:
    """The logging policy's own value: the mean logged reward (on-policy)."""
    value, low, high = ratio_estimate(log.rewards, np.ones_like(log.rewards), ci=ci)
    return Estimate(value, low, high, len(log))


def run_evaluation(
    settings: Settings,
    window: Window = EVERYTHING,
    variations: Variations = Variations(),
    *,
    ci: str = "normal",
    seed: int = 0,
    out_dir: Path = DEFAULT_OUT,
) -> dict[str, Any]:
    """Evaluate the target policies on the window's log; write evaluate.md/.json/.png.

    Returns:
        The figures written to evaluate.json.

    Raises:
        EvaluationError: the window holds no rewarded decision.
    """
    engine = existing_engine(settings.database_url)
    notes: list[str] = []
    try:
        sessions = session_factory(engine)
        log = read_service_log(sessions, window, settings.default_reward)
        q = ridge_rewards(log, seed=seed)
        results, tables = {}, {}
        for policy in target_policies(settings, sessions, log, variations, notes):
            estimates = estimate(policy.probabilities, log, q, ci=ci)
            results[policy.name] = {"note": policy.note, **estimates}
            tables[policy.name] = policy.probabilities
    finally:
        engine.dispose()
    figures: dict[str, Any] = {
        "rows": len(log),
        "unrewarded": log.unrewarded,
        "unactivated": log.unactivated,
        "since": None if window.since is None else window.since.isoformat(),
        "until": None if window.until is None else window.until.isoformat(),
        "logged_versions": sorted({int(v) for v in log.versions}),
        "ci": ci,
        "seed": seed,
        "logged": logged_value(log, ci=ci),
        "policies": results,
        "baseline": compare_with_baseline(log, q, tables, _refit, seed=seed),
        "notes": notes,
    }
    return write_report(figures, out_dir)


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
        description="IPS, SNIPS and DR estimates (95% intervals) of the served model, other "
        "exploration settings, greedy, uniform and older checkpoints on the service's own "
        "decision log (ROFU_DATABASE_URL), each also against the app's own baseline_arm "
        "where requests carried one (apprentice mode); writes evaluate.md, .json and .png.",
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
            get_settings(), window, variations, ci=args.ci, seed=args.seed, out_dir=args.out
        )
    except MissingDatabase as exc:
        print(f"rofu evaluate: {exc}", file=sys.stderr)
        return 2
    except (EvaluationError, ServiceError) as exc:
        print(f"rofu evaluate: {exc}", file=sys.stderr)
        return 1
    print(f"rofu evaluate: {figures['rows']} rewarded decisions", file=sys.stderr)
    print(args.out / "evaluate.md")
    return 0
