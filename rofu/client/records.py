"""The record of a logged decision with its reward: what GET /v1/decisions sends and
`rofu export` writes (re-exported by `rofu.client.schemas`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from rofu.client.schemas import ArmScore


class DecisionRecord(BaseModel):
    """A logged decision and its reward (the rows `rofu export` writes)."""

    # The one record of a decision: the service builds it from its tables by field name
    # (`rofu.service.log.record`), GET /v1/decisions sends it, the exports write it.

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
    reward_metrics: dict[str, float] | None = Field(
        default=None, description="The guardrail metrics sent with the reward; else null"
    )
    baseline_arm: str | None = Field(
        default=None, description="The app's own choice the request carried"
    )
    rofu_arm: str | None = Field(
        default=None,
        description="Apprentice mode (policy `apprentice`, the baseline served) and the "
        "holdout (policy `holdout`): the arm rofu's rule would have chosen; else null",
    )
    rofu_probabilities: list[float] | None = Field(
        default=None,
        description="Apprentice mode and the holdout: rofu's rule's probabilities per "
        "candidate; else null",
    )
    experiment: str | None = Field(
        default=None,
        description="While a holdout ran: the decision's group, `rofu` or `holdout`; else null",
    )
    unit_id: str | None = Field(
        default=None, description="The request's unit id (a holdout assigns by it); else null"
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

    @property
    def chosen_index(self) -> int:
        """The chosen arm's position among the candidates."""
        return self.candidates.index(self.arm)
