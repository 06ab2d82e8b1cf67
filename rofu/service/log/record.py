"""A decision's one record (`rofu.client.records.DecisionRecord`), built from its rows.

Every field of the record is the decision column of the same name, unless `DERIVED`
says how it is made from the rows (a renamed column, the reward's, or a value computed
from several). The decision columns the record leaves out are `INTERNAL`, as are the
reward row's own bookkeeping columns, so adding a column is one field of the record
(plus the table's column and its migration); `tests/unit/test_decision_record.py` holds
the three to each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rofu.client.records import DecisionRecord
from rofu.service.db.tables import DecisionRow, RewardRow
from rofu.service.deciding.apprentice import APPRENTICE
from rofu.service.deciding.select import stored_scores

COLD_START = "cold-start"
#: Decision columns the log does not carry: the idempotency digest, the trainer's mark.
INTERNAL = frozenset({"decisions.request_hash", "decisions.trained_in"})
#: Reward columns the log does not carry (the value, time and lateness are `DERIVED`).
INTERNAL_REWARD = frozenset({"rewards.id", "rewards.event_id", "rewards.repeats"})


@dataclass(frozen=True)
class Derivation:
    """How one record field is made from the rows, and the columns (`table.column`) read."""

    columns: tuple[str, ...]
    of: Callable[[DecisionRow, RewardRow | None], Any]


def _probabilities(decision: DecisionRow) -> list[float] | None:
    """The logged probabilities, or those a row logged before 0004 implies (a cold start is
    uniform, a propensity of 1 leaves the others 0); None when only `propensity` is known."""
    if decision.probabilities is not None:
        return decision.probabilities
    k = len(decision.candidates)
    if decision.policy == COLD_START:
        return [1.0 / k] * k
    if decision.propensity >= 1.0:
        return [float(arm == decision.arm_id) for arm in decision.candidates]
    return None


def _of_reward(name: str) -> Derivation:
    """The reward row's column `name`; None without a reward."""
    return Derivation((f"rewards.{name}",), lambda _, r: None if r is None else getattr(r, name))


#: Record field -> how it is derived, where it is not the decision column of its name.
DERIVED: dict[str, Derivation] = {
    "arm": Derivation(("decisions.arm_id",), lambda d, _: d.arm_id),
    "probabilities": Derivation(
        tuple(f"decisions.{c}" for c in ("probabilities", "candidates", "policy", "propensity")),
        lambda d, _: _probabilities(d),
    ),
    "scores": Derivation(("decisions.scores",), lambda d, _: stored_scores(d)),
    "reward": _of_reward("value"),
    "reward_received_at": _of_reward("received_at"),
    "late": _of_reward("late"),
    "reward_metrics": _of_reward("metrics"),
    "active": Derivation(
        ("decisions.deferred", "decisions.activated_at", "decisions.activation_late"),
        lambda d, _: d.active,
    ),
}
#: The record fields copied from the decision column of the same name.
COPIED = tuple(name for name in DecisionRecord.model_fields if name not in DERIVED)


def decision_record(decision: DecisionRow, reward: RewardRow | None) -> DecisionRecord:
    """The record of a decision row and its reward row (None: no reward yet)."""
    values = {name: getattr(decision, name) for name in COPIED}
    values |= {name: derived.of(decision, reward) for name, derived in DERIVED.items()}
    return DecisionRecord.model_validate(values)


def rule_probabilities(record: DecisionRecord) -> list[float] | None:
    """Rofu's own rule's probabilities per candidate: those it served by, or in apprentice
    mode those it would have (None where not logged)."""
    return record.rofu_probabilities if record.policy == APPRENTICE else record.probabilities
