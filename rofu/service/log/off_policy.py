"""The off-policy pieces the service needs itself (the trainer's evaluation gate,
`rofu.service.lifecycle.gate`), which `rofu evaluate` builds on: a policy's choice
probabilities from a checkpoint's scores, DR's reward model, and DR's value with a
bootstrap 95% interval.

DR is `rofu.replay.ope.dr_estimate` with pi(a_i | x_i) in place of the match indicator,
(1/N) sum_i [sum_a pi(a | x_i) q(x_i, a) + pi(a_i | x_i) / p_i (r_i - q(x_i, a_i))]; it
is restated here because the service never imports the harness (`rofu.replay` needs the
replay extra). Its interval is the percentile bootstrap of the per-row terms'
mean (`BOOTSTRAP_DRAWS` resamples of the rows, drawn from a fixed seed): where a few rows
carry large importance weights the terms are skewed, and the bootstrap's lower end
follows them where mean -/+ 1.96 standard errors would not (`mean_interval` is that
normal interval, for an on-policy mean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from rofu.models.selection import SelectionRule, choice_probabilities
from rofu.service.log.service_log import CheckpointScores, ServiceLog

Z95 = 1.959963984540054
BOOTSTRAP_DRAWS = 1000


@dataclass(frozen=True)
class Interval:
    """A value with its 95% interval over `rows` rows (NaN ends with fewer than 2)."""

    value: float
    low: float
    high: float
    rows: int


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


def ridge_rewards(log: ServiceLog, *, l2: float = 1e-3, seed: int = 0) -> np.ndarray:
    """DR's (and DM's) reward model: (N, S) predictions of a ridge regression per arm on
    [x, 1], each row predicted by the fit on the other fold (the training mean for an arm
    that fold never chose). The ridge is small: shrinkage would bias what DR extrapolates
    to arms that have no logged reward (apprentice logs), which no correction term undoes."""
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


def mean_interval(terms: np.ndarray) -> Interval:
    """The mean of (N,) per-row terms with its normal-approximation 95% interval."""
    n = int(terms.shape[0])
    value = float(terms.mean()) if n else math.nan
    if n < 2:
        return Interval(value, math.nan, math.nan, n)
    se = float(terms.std(ddof=1)) / math.sqrt(n)
    return Interval(value, value - Z95 * se, value + Z95 * se, n)


def bootstrap_interval(terms: np.ndarray, seed: int = 0) -> Interval:
    """The mean of (N,) per-row terms with its percentile-bootstrap 95% interval."""
    n = int(terms.shape[0])
    value = float(terms.mean()) if n else math.nan
    if n < 2:
        return Interval(value, math.nan, math.nan, n)
    rng = np.random.default_rng(seed)
    means = np.array(
        [terms[rng.integers(0, n, n)].mean() for _ in range(BOOTSTRAP_DRAWS)], dtype=np.float64
    )
    low, high = np.quantile(means, [0.025, 0.975])
    return Interval(value, float(low), float(high), n)


def dr_value(probabilities: np.ndarray, log: ServiceLog, q: np.ndarray, seed: int = 0) -> Interval:
    """DR of a policy's (N, S) choice probabilities on the log, q the (N, S) reward model,
    with its bootstrap interval (`bootstrap_interval`, resamples drawn from `seed`)."""
    rows = np.arange(len(log))
    on_logged = probabilities[rows, log.actions]  # (N,) pi(a_i | x_i)
    q_policy = np.nansum(probabilities * q, axis=1)  # (N,)
    terms = q_policy + on_logged / log.propensities * (log.rewards - q[rows, log.actions])
    return bootstrap_interval(terms, seed)
