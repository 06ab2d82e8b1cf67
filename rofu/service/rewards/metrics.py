"""Business metrics: how each decision was made, and what its stored reward says.

The `policy` label of `rofu_selections_total`, `rofu_rewarded_decisions_total` and
`rofu_reward_value_total` says how a decision was made, from what its row records:

- `cold-start`: uniform over the candidates, before any model (the row's `policy`);
- `apprentice`: the app's own `baseline_arm`, served in apprentice mode;
- `holdout`: the control served to a holdout unit (`rofu.service.deciding.holdout`);
- `exploit`: rofu chose an arm with the highest mean among the candidates (what greedy
  would choose, ties included), and every request with `explore: false`;
- `explore`: rofu chose an arm below the best mean: its optimism bonus, the exploration
  floor or inverse-gap weighting moved the choice.

A reward is counted once, when it is stored: late ones included (a late reward is a real
outcome; it is only kept from training), repeats never. So, on every replica,
`rofu_rewarded_decisions_total` summed equals the `accepted` plus `late` outcomes of
`rofu_rewards_total`. Rewards may be negative, and a counter only grows: the reward sum
is exported as its positive and negative parts (`sign`).

The uniform policy's value is estimated by inverse propensity scoring over the rewarded
decisions whose every candidate had a positive probability (cold starts, and every
exploring decision under an exploration floor or inverse-gap weighting): each such row
weighs w = (1/K) / propensity, and IPS = sum(w r) / rows, SNIPS = sum(w r) / sum(w).
"""

from __future__ import annotations

from collections.abc import Sequence

from rofu.models.scores import ArmScore
from rofu.service.db.tables import DecisionRow
from rofu.service.deciding.apprentice import APPRENTICE
from rofu.service.deciding.holdout import HOLDOUT
from rofu.service.deciding.scoring import COLD_START
from rofu.service.metrics import SIGNS, ServiceMetrics

EXPLORE, EXPLOIT = "explore", "exploit"
POLICIES = (EXPLORE, EXPLOIT, COLD_START, APPRENTICE, HOLDOUT)


def decision_policy(row: DecisionRow, scores: Sequence[ArmScore]) -> str:
    """The `policy` label of a decision row, given its per-candidate scores."""
    if row.policy in (COLD_START, APPRENTICE, HOLDOUT):
        return row.policy
    if not row.explore:
        return EXPLOIT  # the argmax of the mean
    means = {score.arm: score.mean for score in scores if score.mean is not None}
    chosen = means.get(row.arm_id)
    if chosen is None or chosen >= max(means.values()):
        return EXPLOIT
    return EXPLORE


def uniform_weight(row: DecisionRow) -> float | None:
    """The uniform policy's importance weight (1/K) / propensity when every candidate had
    a positive probability; None when some had none (IPS cannot use the row)."""
    k = len(row.candidates)
    probabilities = row.probabilities
    if probabilities is None and row.policy == COLD_START:  # rows logged before 0004
        probabilities = [1.0 / k] * k
    if probabilities is None or min(probabilities) <= 0.0:
        return None
    return (1.0 / k) / row.propensity


def count_selection(metrics: ServiceMetrics, row: DecisionRow, scores: Sequence[ArmScore]) -> None:
    """Count a new decision, and export its reward series at 0 until its reward comes: a
    series born with its first reward would hide that reward from `increase()`."""
    policy = decision_policy(row, scores)
    metrics.selections.labels(row.arm_id, policy).inc()
    metrics.rewarded.labels(row.arm_id, policy)
    for sign in SIGNS:
        metrics.reward_value.labels(row.arm_id, policy, sign)


def count_reward(
    metrics: ServiceMetrics, row: DecisionRow, scores: Sequence[ArmScore], value: float
) -> None:
    """Count the reward just stored for `row` (never call it for a repeat)."""
    policy = decision_policy(row, scores)
    metrics.rewarded.labels(row.arm_id, policy).inc()
    parts = {sign: metrics.reward_value.labels(row.arm_id, policy, sign) for sign in SIGNS}
    parts[_sign(value)].inc(abs(value))  # both parts exist, so their difference does
    weight = uniform_weight(row)
    if weight is not None:
        metrics.uniform_rows.inc()
        metrics.uniform_weight.inc(weight)
        metrics.uniform_value.labels(_sign(value)).inc(abs(weight * value))
        metrics.uniform_square.inc((weight * value) ** 2)


def _sign(value: float) -> str:
    return "negative" if value < 0 else "positive"
