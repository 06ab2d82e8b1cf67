"""rofu against the app's own baseline, on the decisions whose request carried a
`baseline_arm` (apprentice mode serves it; online mode only records it).

The baseline is a deterministic policy known on every such row: it chooses b_i. Each
policy pi is compared with it row by row through the doubly robust terms

    DR_i(pi) = sum_a pi(a | x_i) q(x_i, a) + pi(a_i | x_i) / p_i (r_i - q(x_i, a_i)),

so the difference is the mean of DR_i(pi) - DR_i(baseline). Its 95% interval is a
percentile bootstrap over rows that refits the reward model q on every resample, so it
includes q's own estimation noise, which weighs most where no logged reward corrects q.
What the log supports, honestly:

- On a row where apprentice mode served the baseline (p = 1 on b_i, 0 elsewhere),
  DR_i(baseline) = r_i exactly, and the difference is sum_{a != b_i} pi(a | x_i)
  (q(x_i, a) - r_i): where pi agrees with the baseline it is 0, where it does not it
  rests on the reward model q for an arm the baseline did not choose there. No logged
  reward checks q there: the estimate is unbiased only if q is right for those arms
  (q is fitted on the arms the baseline chose in other contexts): the interval covers
  q's noise, not a wrong form of q. IPS and SNIPS of pi use only the rows where pi
  agrees with the baseline (its `support` in the main table, where they are refused
  below the minimum support).
- Without any reward model, pi's value is only bounded: the IPS part over the arms the
  logging rule could choose, plus its probability on the others times the lowest and
  the highest logged reward (`bounds`, assuming rewards stay within that range).
- On rows decided online, pi and the baseline are importance-weighted as usual; the
  baseline's arm has a logged reward only where rofu's rule gave it a positive
  probability.

Each policy is compared on its own rows (`rofu evaluate` passes those fresh for its
checkpoint), the baseline's own value is given on the served checkpoint's. By logged
model version, "rofu as logged" (rofu's own rule at the time: what it served, or in
apprentice mode what it would have served) is compared with the baseline on every row
(each was decided by a model that had not seen it), which shows from which version on
rofu would have beaten it. rofu learned from the baseline's
choices meanwhile; serving its own, it would have learned from other data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rofu.replay.ope import Estimate
from rofu.service.log.service_log import ServiceLog

AS_LOGGED = "rofu as logged"
BEATS = "beats the baseline"
LOSES = "below the baseline"
UNCLEAR = "no clear difference"
#: DR's reward model: (log, seed) -> (N, S) cross-fitted predictions.
FitRewards = Callable[[ServiceLog, int], np.ndarray]


def dr_terms(probabilities: np.ndarray, log: ServiceLog, q: np.ndarray) -> np.ndarray:
    """(N,) per-row doubly robust terms of a policy's (N, S) probabilities."""
    rows = np.arange(len(log))
    on_logged = probabilities[rows, log.actions] / log.propensities  # (N,)
    q_policy = np.nansum(probabilities * q, axis=1)  # (N,)
    terms: np.ndarray = q_policy + on_logged * (log.rewards - q[rows, log.actions])
    return terms


def baseline_probabilities(log: ServiceLog) -> np.ndarray:
    """(N, S) the baseline policy: probability 1 on each row's baseline arm (rows
    without one: all 0)."""
    one_hot = np.zeros((len(log), log.n_slots))
    rows = np.flatnonzero(log.baselines >= 0)
    one_hot[rows, log.baselines[rows]] = 1.0
    return one_hot


def verdict(difference: Estimate) -> str:
    """Which policy the difference's interval favours."""
    if difference.ci_low > 0:
        return BEATS
    if difference.ci_high < 0:
        return LOSES
    return UNCLEAR


def value_bounds(probabilities: np.ndarray, log: ServiceLog) -> list[float] | None:
    """[low, high] of a policy's value with no reward model: rewards of the arms the
    logging rule never chose set to the lowest, then the highest, logged reward. None
    where the log lacks the logging rule's probabilities."""
    if np.isnan(log.logging).any():
        return None
    rows = np.arange(len(log))
    ips = probabilities[rows, log.actions] / log.propensities * log.rewards  # (N,)
    unseen = (probabilities * (log.logging <= 0) * log.candidates).sum(axis=1)  # (N,)
    low, high = float(log.rewards.min()), float(log.rewards.max())
    return [float(ips.mean() + unseen.mean() * low), float(ips.mean() + unseen.mean() * high)]


def _mean(values: np.ndarray, rows: np.ndarray) -> float:
    return float(values[rows].mean()) if rows.any() else np.nan


def _statistics(
    log: ServiceLog,
    q: np.ndarray,
    targets: dict[str, np.ndarray],
    on: dict[str, np.ndarray],
    reference: np.ndarray,
) -> dict[str, float]:
    """Every mean the section reports, on a log (or a resample of it): the baseline's
    value (on the `reference` rows), each target's value and difference (on its rows
    `on[name]`), and by model version rofu as logged (on every row)."""
    keep = log.baselines >= 0
    baseline = dr_terms(baseline_probabilities(log), log, q)
    out = {"baseline": _mean(baseline, keep & reference)}
    for name, probabilities in targets.items():
        mine, rows = dr_terms(probabilities, log, q), keep & on[name]
        out[f"value/{name}"] = _mean(mine, rows)
        out[f"difference/{name}"] = _mean(mine - baseline, rows)
    rule = np.nan_to_num(log.rule)  # rows without it are left out below
    own = dr_terms(rule, log, q)
    logged = keep & ~np.isnan(log.rule).any(axis=1)
    for version in np.unique(log.versions[logged]):
        rows = logged & (log.versions == version)
        out[f"v{version}/baseline"] = _mean(baseline, rows)
        out[f"v{version}/value"] = _mean(own, rows)
        out[f"v{version}/difference"] = _mean(own - baseline, rows)
    if logged.any():
        out[f"value/{AS_LOGGED}"] = _mean(own, logged)
        out[f"difference/{AS_LOGGED}"] = _mean(own - baseline, logged)
    return out


def _bootstrap(
    log: ServiceLog,
    targets: dict[str, np.ndarray],
    on: dict[str, np.ndarray],
    reference: np.ndarray,
    fit: FitRewards,
    point: dict[str, float],
    n_boot: int,
    seed: int,
) -> dict[str, tuple[float, float]]:
    """Percentile 95% intervals of every statistic, q refitted on each resample."""
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {key: [] for key in point}
    for k in range(n_boot):
        rows = rng.integers(len(log), size=len(log))
        resample = log.subset(rows)
        stats = _statistics(
            resample,
            fit(resample, seed + k),
            {n: p[rows] for n, p in targets.items()},
            {n: m[rows] for n, m in on.items()},
            reference[rows],
        )
        for key in point:
            draws[key].append(stats.get(key, np.nan))
    out = {}
    for key, values in draws.items():
        finite = np.array(values)[np.isfinite(values)]
        low, high = np.percentile(finite, [2.5, 97.5]) if finite.size else (np.nan, np.nan)
        out[key] = (float(low), float(high))
    return out


def compare_with_baseline(
    log: ServiceLog,
    q: np.ndarray,
    targets: dict[str, np.ndarray],
    on: dict[str, np.ndarray],
    reference: np.ndarray,
    fit: FitRewards,
    *,
    n_boot: int = 200,
    seed: int = 0,
) -> dict[str, Any] | None:
    """The baseline section of the report: the baseline's value, every target policy
    against it, and rofu as logged against it by model version. None when no decision
    carried a baseline.

    Args:
        log: the whole log; q: (N, S) DR's reward model on it, as `fit(log, seed)` gave.
        targets: policy name -> (N, S) probabilities on the whole log.
        on: policy name -> (N,) bool, the rows it is compared on (those fresh for its
            checkpoint); rofu as logged is compared on every row.
        reference: (N,) bool, the rows the baseline's own value is given on.
        fit: refits q on a bootstrap resample.
    """
    keep = log.baselines >= 0
    if not keep.any():
        return None
    point = _statistics(log, q, targets, on, reference)
    intervals = _bootstrap(log, targets, on, reference, fit, point, n_boot, seed)
    sub = log.subset(keep & reference)

    def estimate(key: str, n: int) -> Estimate:
        return Estimate(point[key], *intervals[key], n)

    def compared(name: str, probabilities: np.ndarray, rows: np.ndarray) -> dict[str, Any]:
        part, n = log.subset(rows), int(rows.sum())
        difference = estimate(f"difference/{name}", n)
        agrees = probabilities[rows][np.arange(n), part.baselines]  # (n,)
        return {
            "rows": n,
            "agreement": float(agrees.mean()) if n else np.nan,
            "value": estimate(f"value/{name}", n),
            "difference": difference,
            "verdict": verdict(difference),
            "bounds": value_bounds(probabilities[rows], part) if n else None,
        }

    policies = {name: compared(name, p, keep & on[name]) for name, p in targets.items()}
    logged = keep & ~np.isnan(log.rule).any(axis=1)
    if logged.any():
        policies[AS_LOGGED] = compared(AS_LOGGED, log.rule, logged)
    by_version = {}
    for version in np.unique(log.versions[logged]):
        rows = logged & (log.versions == version)
        part = log.subset(rows)
        difference = estimate(f"v{version}/difference", int(rows.sum()))
        by_version[str(int(version))] = {
            "rows": int(rows.sum()),
            "agreement": float(part.rule[np.arange(len(part)), part.baselines].mean()),
            "baseline": estimate(f"v{version}/baseline", int(rows.sum())),
            "value": estimate(f"v{version}/value", int(rows.sum())),
            "difference": difference,
            "verdict": verdict(difference),
        }
    return {
        "rows": int((keep & reference).sum()),
        "served": int(sub.served_baseline.sum()),
        "reward_range": [float(log.rewards[keep].min()), float(log.rewards[keep].max())],
        "bootstrap": n_boot,
        "value": estimate("baseline", int((keep & reference).sum())),
        "policies": policies,
        "by_version": by_version,
    }
