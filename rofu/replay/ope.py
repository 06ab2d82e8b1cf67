"""Off-policy evaluation of learning policies on logged bandit feedback (replay, IPS, DR).

One online pass per policy streams the log in time order; at each row the policy chooses
among all items and learns (`Policy.update`) from the row only when its choice equals the
logged item (a "match"), as in the replay method of Li, Chu, Langford & Wang (2011). All
estimators read that one pass, so they estimate one quantity: the mean per-row reward of
the sequence of policies the pass produced.

* replay: mean reward over matched rows; unbiased only for a uniform-random log, so it is
  refused for any other (bts).
* IPS: (1/N) sum_i r_i 1[pick_i = a_i] / p_i. The indicator is a one-sample estimate of
  pi_i(a_i | x_i): unbiased for stochastic policies too, and for any logger with known
  propensities; with a skewed logger the policy learns from an over-sample of the items
  the logger favours, and IPS and DR stay unbiased for the policies it reaches.
* SNIPS: IPS divided by the mean weight (1/N) sum_i 1[pick_i = a_i] / p_i.
* DR: (1/N) sum_i [q(x_i, pick_i) + 1[pick_i = a_i] / p_i (r_i - q(x_i, a_i))], the
  one-sample form of sum_a pi(a | x) q(x, a); q is `rofu.replay.simulation.obd.item_ctr_table`
  (per-item
  CTR shrunk to the overall CTR, cross-fitted over folds of rows).

Each estimate is sum(num) / sum(den) over rows with a 95% interval: the normal
approximation (delta-method standard error) or, with `ci="bootstrap"`, the percentile
bootstrap over rows from a fixed-seed numpy Generator. Both collapse when no matched row
was clicked; `Estimate.matched_reward` says how many were.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rofu.models.policies import Policy
from rofu.models.validation import check_choice, check_int
from rofu.replay.simulation.obd import LoggedBandit, PolicyFactory, RewardTable, item_ctr_table

ESTIMATORS = ("replay", "ips", "dr")
Z95 = 1.959963984540054
Rng = np.random.Generator | None


@dataclass(frozen=True)
class Estimate:
    """A policy value with its 95% confidence interval.

    Attributes:
        value: the estimate (NaN when no row supports it).
        ci_low, ci_high: the interval's ends.
        n: logged rows used.
        n_matched: rows where the policy chose the logged item (None for on-policy means).
        matched_reward: reward summed over matched rows (clicks).
    """

    value: float
    ci_low: float
    ci_high: float
    n: int
    n_matched: int | None = None
    matched_reward: float | None = None


def ratio_estimate(
    num: np.ndarray,
    den: np.ndarray,
    *,
    ci: str = "normal",
    rng: Rng = None,
    n_boot: int = 1000,
) -> tuple[float, float, float]:
    """sum(num) / sum(den) over rows with a 95% interval. (N,), (N,) -> (value, low, high).

    `normal`: value -/+ 1.96 se, se^2 = k/(k-1) sum (num - value den)^2 / sum(den)^2 with
    k the rows where den > 0 (the sample variance / n for a plain mean). `bootstrap`: the
    2.5 and 97.5 percentiles over `n_boot` resamples of the rows.
    """
    check_choice("ci", ci, ("normal", "bootstrap"))
    total = float(den.sum())
    if total <= 0:
        return math.nan, math.nan, math.nan
    value = float(num.sum()) / total
    if ci == "bootstrap":
        low, high = _bootstrap(num, den, rng or np.random.default_rng(0), n_boot)
        return value, low, high
    k = int(np.count_nonzero(den))
    if k < 2:
        return value, math.nan, math.nan
    se = math.sqrt(float(np.square(num - value * den).sum()) * k / (k - 1)) / total
    return value, value - Z95 * se, value + Z95 * se


def _bootstrap(
    num: np.ndarray, den: np.ndarray, rng: np.random.Generator, n_boot: int
) -> tuple[float, float]:
    n, values = len(num), []
    for start in range(0, n_boot, 100):
        rows = rng.integers(n, size=(min(100, n_boot - start), n))  # (b, N)
        with np.errstate(invalid="ignore", divide="ignore"):
            values.append(num[rows].sum(axis=1) / den[rows].sum(axis=1))
    low, high = np.nanpercentile(np.concatenate(values), [2.5, 97.5])
    return float(low), float(high)


def _estimate(
    num: np.ndarray,
    den: np.ndarray,
    matched: np.ndarray | None,
    rewards: np.ndarray,
    ci: str,
    rng: np.random.Generator | None,
) -> Estimate:
    value, low, high = ratio_estimate(num, den, ci=ci, rng=rng)
    if matched is None:
        return Estimate(value, low, high, len(num))
    support = matched > 0  # bool, or the policy's probability of the logged item
    hits = float(rewards[support].sum())
    return Estimate(value, low, high, len(num), int(support.sum()), hits)


def replay_estimate(
    rewards: np.ndarray, matched: np.ndarray, *, ci: str = "normal", rng: Rng = None
) -> Estimate:
    """Mean reward over matched rows (Li et al. 2011); needs a uniform-random log.

    Args:
        rewards: (N,) logged rewards.
        matched: (N,) bool, the policy chose the logged item.
        ci, rng: as in `ratio_estimate`.
    """
    m = matched.astype(np.float64)
    return _estimate(rewards * m, m, matched, rewards, ci, rng)


def ips_estimate(
    rewards: np.ndarray,
    matched: np.ndarray,
    propensities: np.ndarray,
    *,
    ci: str = "normal",
    rng: Rng = None,
) -> Estimate:
    """(1/N) sum r 1[match] / p over (N,) arrays; the rest as in `replay_estimate`.
    `matched` may also be pi(a_i | x_i), the indicator's expectation (no sampling noise)."""
    terms = rewards * matched / propensities
    return _estimate(terms, np.ones_like(terms), matched, rewards, ci, rng)


def snips_estimate(
    rewards: np.ndarray,
    matched: np.ndarray,
    propensities: np.ndarray,
    *,
    ci: str = "normal",
    rng: Rng = None,
) -> Estimate:
    """Self-normalised IPS, sum r w / sum w with w = matched / p: slightly biased, within
    the rewards' range, and steadier than IPS when weights are large."""
    weights = matched / propensities
    return _estimate(rewards * weights, weights, matched, rewards, ci, rng)


def dr_estimate(
    rewards: np.ndarray,
    matched: np.ndarray,
    propensities: np.ndarray,
    q_logged: np.ndarray,
    q_pick: np.ndarray,
    *,
    ci: str = "normal",
    rng: Rng = None,
) -> Estimate:
    """(1/N) sum [q(x, pick) + 1[match] / p (r - q(x, a))].

    Args:
        q_logged: (N,) reward model at the logged item. q_pick: (N,) at the policy's pick
            (with probabilities for `matched`: sum_a pi(a | x) q(x, a)).
        The rest as in `ips_estimate`.
    """
    terms = q_pick + matched / propensities * (rewards - q_logged)
    return _estimate(terms, np.ones_like(terms), matched, rewards, ci, rng)


def behavior_value(logged: LoggedBandit, *, ci: str = "normal", rng: Rng = None) -> Estimate:
    """The logging policy's own value: mean reward of the log (on-policy)."""
    ones = np.ones_like(logged.rewards)
    return _estimate(logged.rewards, ones, None, logged.rewards, ci, rng)


def policy_pass(policy: Policy, logged: LoggedBandit, *, chunk_size: int = 16) -> np.ndarray:
    """Stream the log through `policy`; it learns from matched rows only. -> (N,) picks.

    Rows are selected `chunk_size` at a time: the policy does not change until its first
    match in the chunk, so the picks up to that row are the ones a row-by-row loop would
    make (with other random draws); the rows after it are selected again after the update.
    """
    check_int("chunk_size", chunk_size, low=1)
    contexts = torch.tensor(logged.contexts)  # a copy: the log may be read-only
    picks = np.empty(len(logged), dtype=np.int64)
    start = 0
    while start < len(logged):
        stop = min(start + chunk_size, len(logged))
        arms = policy.select(contexts[start:stop]).arms.cpu().numpy()
        hits = np.flatnonzero(arms == logged.actions[start:stop])
        end = stop if hits.size == 0 else start + int(hits[0]) + 1
        picks[start:end] = arms[: end - start]
        if hits.size:
            policy.update(logged.transitions(slice(end - 1, end)))
        start = end
    return picks


def evaluate(
    policies: dict[str, PolicyFactory],
    logged: LoggedBandit,
    *,
    estimators: Sequence[str] | None = None,
    ci: str = "normal",
    seed: int = 0,
    chunk_size: int = 16,
    reward_model: RewardTable | None = None,
) -> dict[str, dict[str, Estimate]]:
    """Run each policy factory (context_dim, n_arms) -> Policy once over the log.

    Args:
        policies: name -> factory; each factory is called once, for a fresh policy.
        logged: the log, in time order.
        estimators: among `replay`, `ips`, `dr`; None gives all three on a uniform log and
            `ips`, `dr` otherwise.
        ci: `normal` or `bootstrap` (bootstrap rows drawn from default_rng(seed)).
        seed: seeds the bootstrap and the reward model's folds (not the policies).
        chunk_size: rows per `select` call (see `policy_pass`).
        reward_model: DR's q; `item_ctr_table(logged, seed=seed)` when None.

    Returns:
        policy name -> estimator name -> Estimate.

    Raises:
        ValueError: `replay` asked for on a log that is not uniform-random.
    """
    names = _estimators(estimators, logged)
    table = item_ctr_table(logged, seed=seed) if reward_model is None else reward_model
    out: dict[str, dict[str, Estimate]] = {}
    for name, factory in policies.items():
        picks = policy_pass(
            factory(logged.context_dim, logged.n_items), logged, chunk_size=chunk_size
        )
        out[name] = _estimates(picks, logged, table, names, ci, seed)
    return out


def _estimators(estimators: Sequence[str] | None, logged: LoggedBandit) -> tuple[str, ...]:
    if estimators is None:
        return ESTIMATORS if logged.uniform else ("ips", "dr")
    for name in estimators:
        check_choice("estimators", name, ESTIMATORS)
    if "replay" in estimators and not logged.uniform:
        raise ValueError(
            f"estimators: replay is biased unless the log is uniform-random; {logged.name} "
            "is not (use ips or dr)"
        )
    return tuple(estimators)


def _estimates(
    picks: np.ndarray,
    logged: LoggedBandit,
    table: RewardTable,
    names: tuple[str, ...],
    ci: str,
    seed: int,
) -> dict[str, Estimate]:
    r, p, matched = logged.rewards, logged.propensities, picks == logged.actions
    out = {}
    for name in names:
        rng = np.random.default_rng(seed)
        if name == "replay":
            out[name] = replay_estimate(r, matched, ci=ci, rng=rng)
        elif name == "ips":
            out[name] = ips_estimate(r, matched, p, ci=ci, rng=rng)
        else:
            out[name] = dr_estimate(
                r, matched, p, table.at(logged.actions), table.at(picks), ci=ci, rng=rng
            )
    return out
