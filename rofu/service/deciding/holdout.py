"""The holdout (`ROFU_HOLDOUT_SHARE`): a control group served without rofu, to measure it.

A decision is in the holdout when the unit it is made for hashes below the share:

    u = 53 bits of SHA-256("holdout:{salt}:{unit}") / 2^53,  in the holdout iff u < share

where the unit is the request's `unit_id` (a user, a device: the same unit is always in
the same group, whatever replica answers) or, without one, the decision's event id (each
request drawn afresh). The salt (`ROFU_HOLDOUT_SALT`) starts a new experiment: another
salt reshuffles the units. The draw is independent of rofu's own (`event_uniform`), so the
holdout takes no part in which arm rofu would choose.

A holdout decision is served by the control: the request's `baseline_arm` (probability 1:
the app's own choice) when it sent one, else an arm drawn uniformly from the candidates
(probability 1/K each, the draw derived from the event id). It is logged as what it is:
`policy` "holdout" with those true probabilities, and, as apprentice mode does, rofu's own
choice and probabilities beside it (`rofu_arm`, `rofu_probabilities`), which it did not
serve. The trainer never trains on it (`rofu.service.lifecycle.trainer`). Every decision
made while a holdout runs records its group in `experiment` ("rofu" or "holdout") and the
`unit_id` it was assigned by, for `GET /v1/report` (`rofu.service.experiment`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from rofu.service.db.tables import HOLDOUT, DecisionRow
from rofu.service.deciding.catalogue import Arm

ROFU_GROUP = "rofu"

__all__ = ["HOLDOUT", "ROFU_GROUP", "in_holdout", "unit_uniform", "with_holdout"]


def unit_uniform(salt: str, unit: str) -> float:
    """The unit's number in [0, 1): 53 bits of SHA-256("holdout:{salt}:{unit}")."""
    digest = hashlib.sha256(f"holdout:{salt}:{unit}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / 2.0**53


def in_holdout(share: float, salt: str, unit: str) -> bool:
    """Whether `unit` is in the holdout of this share and salt."""
    return share > 0.0 and unit_uniform(salt, unit) < share


def with_holdout(
    row: DecisionRow,
    unit_id: str | None,
    candidates: Sequence[Arm],
    *,
    share: float,
    salt: str,
) -> DecisionRow:
    """The row to store for rofu's decision `row` while a holdout of `share` runs: its group
    recorded, and, for a holdout unit, the control served (the baseline, else uniform) with
    rofu's own choice kept beside it. Unchanged when no holdout runs (`share` 0)."""
    if share <= 0.0:
        return row
    row.unit_id = unit_id
    if not in_holdout(share, salt, unit_id if unit_id is not None else row.event_id):
        row.experiment = ROFU_GROUP
        return row
    row.experiment = HOLDOUT
    row.rofu_arm, row.rofu_probabilities = row.arm_id, row.probabilities
    k = len(candidates)
    if row.baseline_arm is not None:
        index = next(i for i, arm in enumerate(candidates) if arm.id == row.baseline_arm)
        row.probabilities = [float(i == index) for i in range(k)]
    else:
        index = min(math.floor(unit_uniform(f"{salt}:draw", row.event_id) * k), k - 1)
        row.probabilities = [1.0 / k] * k
    row.arm_id, row.slot = candidates[index].id, candidates[index].slot
    row.propensity = row.probabilities[index]
    row.explore, row.policy = False, HOLDOUT
    return row
