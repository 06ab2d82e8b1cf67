"""One target policy's value on the rows it is evaluated on, and what the log supports.

IPS, SNIPS and DR (`rofu.replay.ope`, with pi(a_i | x_i) in place of the match
indicator) are unbiased only where the logging rule gave the target's choices a positive
probability. The support of a policy is the share of its choices that lie there,

    support = (1/N) sum_i sum_a pi(a | x_i) 1[p_log(a | x_i) > 0],

over the rows whose logged probabilities are known (a row logged before 0004 may hold the
chosen arm's propensity alone). Below `MIN_SUPPORT` no reweighting can see what the other
choices earn, and IPS, SNIPS and DR are refused; the direct method (DM), the mean of
sum_a pi(a | x_i) q(x_i, a) under the reward model q, is given for every policy: it rests
on q alone, and its interval covers the rows' noise with q held fixed, not q's own error.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rofu.replay.ope import Estimate, dr_estimate, ips_estimate, ratio_estimate, snips_estimate
from rofu.service.log.off_policy import ridge_rewards as ridge_rewards  # DR's model
from rofu.service.log.service_log import ServiceLog

#: Support below which IPS, SNIPS and DR are refused (`rofu evaluate --min-support`): past
#: 5% of a policy's choices the log never made, no reweighting shows what they earn.
MIN_SUPPORT = 0.95
REWEIGHTED = ("ips", "snips", "dr")


def support(probabilities: np.ndarray, log: ServiceLog) -> tuple[float | None, int]:
    """(the share of a policy's (N, S) choices the log gives a positive probability, on
    the rows whose logged probabilities are known or None without any; those rows)."""
    known = ~np.isnan(log.logging).any(axis=1)  # (N,)
    if not known.any():
        return None, 0
    on = (probabilities * (log.logging > 0) * log.candidates).sum(axis=1)  # (N,)
    return float(on[known].mean()), int(known.sum())


def refusal(share: float | None, min_support: float) -> str | None:
    """Why IPS, SNIPS and DR are refused, None when they are not (support unknown: not)."""
    if share is None or share >= min_support:
        return None
    return f"not supported ({share:.1%} of its choices on the log's support)"


def reweighted(
    probabilities: np.ndarray, log: ServiceLog, q: np.ndarray, *, ci: str, seed: int
) -> dict[str, Estimate]:
    """IPS, SNIPS and DR of (N, S) probabilities, q the (N, S) reward model."""
    rows = np.arange(len(log))
    on_logged = probabilities[rows, log.actions]  # (N,) pi(a_i | x_i)
    r, p = log.rewards, log.propensities
    q_policy = np.nansum(probabilities * q, axis=1)  # (N,) sum_a pi(a | x) q(x, a)
    q_logged = q[rows, log.actions]  # (N,)
    return {
        "ips": ips_estimate(r, on_logged, p, ci=ci, rng=np.random.default_rng(seed)),
        "snips": snips_estimate(r, on_logged, p, ci=ci, rng=np.random.default_rng(seed)),
        "dr": dr_estimate(
            r, on_logged, p, q_logged, q_policy, ci=ci, rng=np.random.default_rng(seed)
        ),
    }


def estimate(
    probabilities: np.ndarray,
    log: ServiceLog,
    q: np.ndarray,
    *,
    ci: str = "normal",
    seed: int = 0,
    min_support: float = MIN_SUPPORT,
) -> dict[str, Any]:
    """IPS, SNIPS and DR (None where refused) and DM of one target policy, its support and
    its effective sample size. (N, S) probabilities and q on the policy's rows."""
    share, known = support(probabilities, log)
    refused = refusal(share, min_support)
    figures: dict[str, Estimate | None] = dict.fromkeys(REWEIGHTED)
    if refused is None:
        figures |= reweighted(probabilities, log, q, ci=ci, seed=seed)
    q_policy = np.nansum(probabilities * q, axis=1)  # (N,)
    dm = ratio_estimate(q_policy, np.ones_like(q_policy), ci=ci, rng=np.random.default_rng(seed))
    weights = probabilities[np.arange(len(log)), log.actions] / log.propensities  # (N,)
    return {
        **figures,
        "dm": Estimate(*dm, len(log)),
        "support": share,
        "support_rows": known,
        "refused": refused,
        "effective_rows": float(weights.sum() ** 2 / max(float(np.square(weights).sum()), 1e-300)),
    }


def logged_value(log: ServiceLog, *, ci: str = "normal") -> Estimate:
    """The logging policy's own value: the mean logged reward (on-policy)."""
    value, low, high = ratio_estimate(log.rewards, np.ones_like(log.rewards), ci=ci)
    return Estimate(value, low, high, len(log))
