"""The API's (and the client's) view of a logged decision: a row of `GET /v1/decisions`.

Kept apart from the route so that `rofu.client` reads typed rows without the web stack.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from rofu.models.scores import ArmScore

if TYPE_CHECKING:
    from rofu.service.log.pages import LoggedDecision


class DecisionRecord(BaseModel):
    """A logged decision and its reward (the rows `rofu export` writes)."""

    event_id: str
    created_at: datetime
    context: list[float]
    candidates: list[str]
    arm: str
    slot: int
    propensity: float
    probabilities: list[float] | None = Field(
        description="Per candidate, in `candidates` order; null when only `propensity` is known"
    )
    model_version: int
    policy: str
    explore: bool
    scores: list[ArmScore]
    reward: float | None
    reward_received_at: datetime | None
    late: bool | None = Field(description="The reward came after the decision's window")
    baseline_arm: str | None = Field(
        default=None, description="The app's own choice the request carried"
    )
    rofu_arm: str | None = Field(
        default=None,
        description="Apprentice mode (policy `apprentice`, the baseline served): the arm "
        "rofu's rule would have chosen; else null",
    )
    rofu_probabilities: list[float] | None = Field(
        default=None,
        description="Apprentice mode: rofu's rule's probabilities per candidate; else null",
    )
    named_context: dict[str, Any] | None = Field(
        default=None,
        description="The named features the request sent (`context` is their hashed "
        "vector); null for a dense context",
    )
    arm_features: dict[str, list[float]] | None = Field(
        default=None,
        description="Candidate arm id -> the features it was scored with, for the arms "
        "the request gave its own; null when all had the catalogue's",
    )
    deferred: bool = Field(default=False, description="Logged with `defer`")
    activated_at: datetime | None = Field(
        default=None, description="A deferred decision's first activation; null: none"
    )
    activation_late: bool = Field(
        default=False, description="Activated after its window or after the trainer consumed it"
    )
    active: bool = Field(
        default=True,
        description="Trained on and evaluated: not deferred, or activated in time (false: "
        "a deferred decision not activated in time, left out of training and evaluation)",
    )

    @classmethod
    def of(cls, record: LoggedDecision) -> DecisionRecord:
        """The API view of a record."""
        return cls(
            event_id=record.event_id,
            created_at=record.created_at,
            context=record.context,
            candidates=record.candidates,
            arm=record.arm_id,
            slot=record.slot,
            propensity=record.propensity,
            probabilities=record.probabilities,
            model_version=record.model_version,
            policy=record.policy,
            explore=record.explore,
            scores=record.scores,
            reward=record.reward,
            reward_received_at=record.reward_received_at,
            late=record.late,
            baseline_arm=record.baseline_arm,
            rofu_arm=record.rofu_arm,
            rofu_probabilities=record.rofu_probabilities,
            named_context=record.named_context,
            arm_features=record.arm_features,
            deferred=record.deferred,
            activated_at=record.activated_at,
            activation_late=record.activation_late,
            active=record.active,
        )
