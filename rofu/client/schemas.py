"""The v1 API's request and response bodies, as they travel: the service's OpenAPI schema is
generated from these, and the client reads its answers with them.

Requests are strict: numbers must be JSON numbers (no strings, no NaN or Infinity), and
unknown fields are refused, so a typo never passes silently. What only the service can
check (a context's length, named features and their hashing) it checks itself, on
`SelectFields` parametrised with its own feature type (`rofu.service.api.schemas`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

EVENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$"
ARM_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$"
EventId = Annotated[
    str,
    Field(
        pattern=EVENT_ID_PATTERN,
        description="Client idempotency key: 1-128 characters of [A-Za-z0-9_.:-]",
        examples=["order-1234"],
    ),
]
ArmId = Annotated[str, Field(pattern=ARM_ID_PATTERN, examples=["arm-0"])]
UnitId = Annotated[
    str,
    Field(
        pattern=EVENT_ID_PATTERN,
        description="A holdout's unit: 1-128 characters of [A-Za-z0-9_.:-]",
        examples=["user-42"],
    ),
]
Finite = Annotated[float, Field(allow_inf_nan=False)]
METRIC_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
MetricName = Annotated[str, Field(pattern=METRIC_NAME_PATTERN, examples=["latency_ms"])]
#: The most guardrail metrics one reward may carry.
MAX_METRICS = 16
FLOAT32_MAX = 3.4028234663852886e38
# Context features go through the network in float32: larger magnitudes would be infinite.
Feature = Annotated[float, Field(allow_inf_nan=False, ge=-FLOAT32_MAX, le=FLOAT32_MAX)]

# A named feature's value, and named features (documented in `rofu.service.deciding.features`).
FeatureValue = float | bool | str | list[str] | list[float] | None
NamedFeatures = dict[str, FeatureValue]
NamedContext = dict[str, NamedFeatures | FeatureValue]
#: A context or an arm's features: a dense vector, or an object of named features.
Features = list[Feature] | NamedContext
FeaturesT = TypeVar("FeaturesT")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class SelectFields(_Strict, Generic[FeaturesT]):
    """The fields of a /v1/select request, over the type its features validate as."""

    context: Annotated[
        FeaturesT,
        Field(
            description="A feature vector of the configured context_dim, or an object of "
            "named features (namespaces of numbers, booleans, strings and lists) hashed "
            "into it (see the README, `Named features`)",
            examples=[
                [0.1, -0.4, 1.0, 0.0, 0.3, 0.2, -1.2, 0.5],
                {"user": {"age": 31, "country": "fr"}, "device": {"mobile": True}},
            ],
        ),
    ]
    event_id: EventId | None = Field(
        default=None, description="Same key -> same decision; generated when omitted"
    )
    arms: list[ArmId] | None = Field(
        default=None, description="Candidate subset (default: every active arm)"
    )
    exclude: list[ArmId] | None = Field(default=None, description="Arms not to choose")
    explore: bool = Field(
        default=True, description="False: choose by the mean alone (exploit); still logged"
    )
    baseline_arm: ArmId | None = Field(
        default=None,
        description="The app's own choice, one of the candidates: served in apprentice mode "
        "(ROFU_LEARNING_MODE=apprentice, where it is required), recorded for comparison in "
        "online mode",
    )
    unit_id: UnitId | None = Field(
        default=None,
        description="The unit (a user, a device) a holdout assigns by: the same unit is "
        "always in the same group (ROFU_HOLDOUT_SHARE); without it, each request is drawn "
        "afresh",
    )
    defer: bool = Field(
        default=False,
        description="True: trained on only once POST /v1/events/{event_id}/activate "
        "activates it within the reward window (the app may not show the choice)",
    )
    explain: bool = Field(
        default=False,
        description="True: the answer's `explanations` give, per candidate, the context "
        "features that moved its mean the most (gradient x input); not part of the "
        "request's identity (a repeat with the same event_id replays without them)",
    )
    arm_features: dict[ArmId, FeaturesT] | None = Field(
        default=None,
        description="Per-request arm features (arm-feature models only): candidate arm id "
        "-> arm_feature_dim numbers, or named features hashed into them; they replace "
        "the catalogue's features of that arm for this decision, and are trained on",
        examples=[{"arm-0": {"price": 9.5, "category": "shoes"}}],
    )


class SelectRequest(SelectFields[Features]):
    """Which arm should this context get?"""


class ArmScore(BaseModel):
    """One candidate's estimates for one context, as logged and returned by /select.

    Attributes:
        arm: the arm's id.
        mean: estimated reward; None on a cold start (nothing was scored).
        bonus: exploration bonus; None on a cold start.
        ucb: mean + bonus, the value an exploring choice is made by; None on a cold start.
    """

    # The service hands over its own scores (`rofu.models.scores.ArmScore`) as they are.
    model_config = ConfigDict(from_attributes=True)

    arm: str
    mean: float | None
    bonus: float | None
    ucb: float | None


class ArmProbability(BaseModel):
    """The probability with which the service's rule picks one candidate."""

    arm: str
    probability: float


class FeatureContribution(BaseModel):
    """One context feature's pull on an arm's estimated mean."""

    feature: str = Field(
        description="`context[i]` for a dense context; a named entry's name "
        "(`user.country=fr`, `hour`) for a named one"
    )
    index: int = Field(description="Its index in the context vector the model reads")
    contribution: float = Field(
        description="d mean / d x_index times the entry's value (gradient x input)"
    )


class ArmExplanation(BaseModel):
    """Why one candidate's mean is what it is: its largest contributions first."""

    arm: str
    features: list[FeatureContribution]


class SelectResponse(BaseModel):
    """The decision, the scores it was made from and every candidate's probability."""

    event_id: str
    arm: str
    model_version: int = Field(description="Checkpoint version used; 0 before any exists")
    propensity: float = Field(description="Probability with which this arm was chosen")
    explore: bool
    policy: str = Field(description="`rofu`, or `cold-start` (uniform) before any model")
    scores: list[ArmScore]  # per candidate; mean, bonus and ucb null on a cold start
    probabilities: list[ArmProbability] | None = Field(
        default=None,
        description="Per candidate, in the order of `scores`: the exact probability with "
        "which the rule picks it (the chosen arm's is `propensity`); null for decisions "
        "logged before probabilities were stored",
    )
    baseline_arm: str | None = Field(default=None, description="The request's baseline_arm")
    rofu_arm: str | None = Field(
        default=None,
        description="Apprentice mode and holdout: the arm rofu's own rule chose (not "
        "served); else null",
    )
    experiment: str | None = Field(
        default=None,
        description="While a holdout runs: `rofu` or `holdout`, the group of this decision "
        "(a holdout decision's policy is `holdout`); else null",
    )
    deferred: bool = Field(
        default=False, description="Logged with `defer`: awaits activation to be trained on"
    )
    explanations: list[ArmExplanation] | None = Field(
        default=None,
        description="With `explain: true`, per candidate in the order of `scores`, the 5 "
        "context features with the largest contributions to its mean; null otherwise, on a "
        "cold start and for a replayed event_id",
    )


class ValidateResponse(BaseModel):
    """A /select request checked as /select checks it, with nothing decided or stored."""

    valid: bool = Field(description="Always true: an invalid request is a 422 instead")
    context: list[float] = Field(description="The context vector the model would read")
    arm_features: dict[str, list[float]] = Field(
        default_factory=dict, description="Each per-request arm's feature vector, likewise"
    )


class RewardRequest(_Strict):
    """How did the decision of `event_id` go?"""

    event_id: EventId
    value: Finite = Field(description="The reward; any finite number", examples=[1.0])
    metrics: dict[MetricName, Finite] | None = Field(
        default=None,
        max_length=MAX_METRICS,
        description="Guardrail metrics of the outcome (name -> finite number, at most 16, "
        "names of [A-Za-z0-9_]): stored with the reward, compared between rofu and the "
        "holdout by GET /v1/report, never trained on",
        examples=[{"latency_ms": 120.0}],
    )


class RewardResponse(BaseModel):
    """The stored reward. `duplicate` marks a repeat of an already stored value."""

    event_id: str
    value: float
    duplicate: bool
    late: bool = Field(
        default=False,
        description="The reward came after the decision's window closed or after a "
        "checkpoint consumed the decision: stored, but never trained on",
    )


class ActivateResponse(BaseModel):
    """What POST /v1/events/{event_id}/activate did."""

    event_id: str
    status: Literal["activated", "already_active", "late"] = Field(
        description="`activated`: the decision is active and will be trained on; "
        "`already_active`: it was never deferred, or an earlier call activated it; "
        "`late`: activated after its window closed or after the trainer consumed it: "
        "stored, but never trained on or evaluated"
    )
    deferred: bool = Field(description="Whether the decision was logged with `defer`")
    activated_at: datetime | None = Field(
        description="The first activation's time; null for a decision never deferred"
    )
    duplicate: bool = Field(description="An earlier activation was stored: nothing changed")


class ArmRequest(_Strict):
    """A new arm for the catalogue."""

    id: ArmId
    features: list[Finite] | None = Field(
        default=None, description="Required (length arm_feature_dim) for arm-feature models"
    )


class ArmResponse(BaseModel):
    """An arm of the catalogue."""

    id: str
    slot: int
    features: list[float] | None
    active: bool


class LearnerInfo(BaseModel):
    """One candidate learner of the served checkpoint."""

    name: str
    prequential_loss: float | None = Field(
        description="Exponentially weighted squared loss, each row scored before the refit "
        "that trained on it; null before any row"
    )
    served: bool


class TrainingInfo(BaseModel):
    """How soon the service can learn: when its trainer runs and which decisions it trains on.

    These are this replica's settings; a separate `rofu trainer` process reads its own.
    """

    trainer: Literal["embedded", "external"] = Field(
        description="`embedded`: the service's own process trains, in a background thread; "
        "`external`: a separate `rofu trainer` process is expected (ROFU_EMBEDDED_TRAINER "
        "false, or ROFU_REDIS_URL set), which the service cannot see"
    )
    reward_window_seconds: float = Field(
        description="A decision is trained on once this long has passed since it was made "
        "(ROFU_REWARD_WINDOW_SECONDS; 0: at the trainer's next run)"
    )
    train_every_rewards: int = Field(
        description="A training run starts after this many new rewards (ROFU_TRAIN_EVERY_REWARDS)"
    )
    train_interval_seconds: float = Field(
        description="A training run also starts once this long passed since the last one "
        "(ROFU_TRAIN_INTERVAL_SECONDS)"
    )
    checkpoint_poll_seconds: float = Field(
        description="How often a replica looks for a new checkpoint no notice announced "
        "(ROFU_CHECKPOINT_POLL_SECONDS)"
    )


class ModelResponse(BaseModel):
    """The model this replica serves."""

    version: int = Field(description="0: no checkpoint yet (cold start, uniform choices)")
    checksum: str | None
    created_at: datetime | None = Field(
        description="When the trainer made it (ISO 8601, UTC); null: no checkpoint yet"
    )
    age_seconds: float | None
    n_data: int = Field(description="|D|, logged transitions the checkpoint learned from")
    network: dict[str, object]
    rofu: dict[str, object]
    feature_hash_seed: int = Field(
        description="The seed named features are hashed with (ROFU_FEATURE_HASH_SEED)"
    )
    learner: str | None = Field(
        default=None, description="The candidate learner served (ROFU_LEARNERS); null: no model"
    )
    learners: list[LearnerInfo] = Field(
        default_factory=list,
        description="Every candidate learner the trainer refitted for the served checkpoint",
    )
    training: TrainingInfo | None = Field(
        default=None, description="When the service trains; absent from older services"
    )


class CheckpointInfo(BaseModel):
    """A stored checkpoint's metadata."""

    version: int
    created_at: datetime = Field(description="When the trainer made it (ISO 8601, UTC)")
    checksum: str
    size_bytes: int
    rows_trained: int
    n_total: int
    metrics: dict[str, float]
    gate_status: Literal["candidate", "promoted", "rejected"] = Field(
        "promoted",
        description="The evaluation gate's: candidate (not served yet), promoted (servable) "
        "or rejected (kept, never served)",
    )
    gate: dict[str, Any] | None = Field(
        None,
        description="What the decision rested on: the candidate's DR and the serving model's "
        "logged value with their 95% intervals, rows, tolerance, reason, when and by whom "
        "(gate or operator); null when undecided or stored before the gate",
    )


class ErrorBody(BaseModel):
    """What every error response carries."""

    code: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    """The body of every 4xx/5xx response."""

    error: ErrorBody
