"""The service's tables (SQLAlchemy 2 declarative); the schema is owned by Alembic."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    TypeDecorator,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime written to a UTC column")
        return None if value is None else value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


#: The gate statuses of a checkpoint (`CheckpointRow.gate_status`).
CANDIDATE, PROMOTED, REJECTED = "candidate", "promoted", "rejected"


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


#: The `experiment` (and `policy`) of a decision served by a holdout's control: never
#: trained on (`rofu.service.deciding.holdout`).
HOLDOUT = "holdout"


def is_active(deferred: bool, activated_at: datetime | None, activation_late: bool) -> bool:
    """Whether a decision may be trained on and evaluated: not deferred, or activated in
    time."""
    return not deferred or (activated_at is not None and not activation_late)


class Base(DeclarativeBase):
    """Declarative base of every table."""

    type_annotation_map = {dict[str, Any]: JSON, list[float]: JSON, list[str]: JSON}


class ArmRow(Base):
    """The arm catalogue. A slot is the arm's output/feature index; never reused."""

    __tablename__ = "arms"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    slot: Mapped[int] = mapped_column(unique=True)
    features: Mapped[list[float] | None] = mapped_column(JSON)
    active: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    retired_at: Mapped[datetime | None] = mapped_column(UtcDateTime())


class DecisionRow(Base):
    """One /select answer: enough to replay it and to run off-policy evaluation."""

    __tablename__ = "decisions"
    __table_args__ = (
        Index("ix_decisions_untrained", "trained_in", "created_at"),
        Index("ix_decisions_log_order", "created_at", "event_id"),  # the log's keyset pages
        Index("ix_decisions_experiment", "experiment", "created_at"),  # GET /v1/report
    )

    event_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    context: Mapped[list[float]] = mapped_column(JSON)
    candidates: Mapped[list[str]] = mapped_column(JSON)
    arm_id: Mapped[str] = mapped_column(String(128))
    slot: Mapped[int]
    propensity: Mapped[float]
    # Per candidate, in `candidates` order, the probability with which the rule picked it
    # (the chosen arm's is `propensity`); None on rows logged before 2026-12 (0004).
    probabilities: Mapped[list[float] | None] = mapped_column(JSON, default=None)
    model_version: Mapped[int]
    explore: Mapped[bool]
    policy: Mapped[str] = mapped_column(String(32))
    # A list of rofu.models.scores.ArmScore as dicts (before 2026-11-25: arm -> [mean, bonus, ucb]).
    scores: Mapped[list[dict[str, Any]] | dict[str, Any]] = mapped_column(JSON)
    request_hash: Mapped[str] = mapped_column(String(64))
    # The app's own choice (`baseline_arm`), when the request carried one; in apprentice
    # mode it was served (probability 1, policy `apprentice`) and `rofu_arm` /
    # `rofu_probabilities` keep what rofu's rule would have chosen, with what
    # probabilities (None otherwise: rofu's choice is `arm_id`). Since 0006.
    baseline_arm: Mapped[str | None] = mapped_column(String(128), default=None)
    rofu_arm: Mapped[str | None] = mapped_column(String(128), default=None)
    rofu_probabilities: Mapped[list[float] | None] = mapped_column(JSON, default=None)
    trained_in: Mapped[int | None] = mapped_column(default=None)
    # Deferred activation (0005): a deferred decision is trained on only once activated
    # in time; one activated after its window closed or after the trainer consumed it is
    # `activation_late` (rofu.service.rewards.activation).
    deferred: Mapped[bool] = mapped_column(default=False, server_default=false())
    activated_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), default=None)
    activation_late: Mapped[bool] = mapped_column(default=False, server_default=false())
    # `context` holds the vector the model read. A request that sent named features keeps
    # them here as validated (0007): the audit trail and export show what the client
    # sent, and a change of hash seed or dimension can re-hash them. Else None.
    named_context: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # Per-request arm features (0007): arm id -> the vector the model scored that
    # candidate with (hashed when sent as named features), which the trainer trains the
    # chosen arm on; None when the request sent none (the catalogue's were used).
    arm_features: Mapped[dict[str, list[float]] | None] = mapped_column(JSON, default=None)
    # While a holdout runs (0008): the group the decision was assigned to ("rofu" or
    # "holdout", `rofu.service.deciding.holdout`) and the request's `unit_id` it was
    # assigned by (None: by the event id). None for decisions made without a holdout.
    experiment: Mapped[str | None] = mapped_column(String(16), default=None)
    unit_id: Mapped[str | None] = mapped_column(String(128), default=None)

    @property
    def active(self) -> bool:
        """Whether the decision may be trained on and evaluated (`is_active`)."""
        return is_active(self.deferred, self.activated_at, self.activation_late)


class RewardRow(Base):
    """The reward of a decision: one row per event, first value wins."""

    __tablename__ = "rewards"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("decisions.event_id"), unique=True
    )
    value: Mapped[float]
    received_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    repeats: Mapped[int] = mapped_column(default=0)
    # Arrived after the decision's reward window closed, or after a checkpoint consumed
    # the decision: stored, never trained on (rofu.service.lifecycle.trainer).
    late: Mapped[bool] = mapped_column(default=False, server_default=false())
    # Guardrail metrics the app reported with the reward (0008): name -> finite number.
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class CheckpointRow(Base):
    """A durable checkpoint: metadata, and the blob itself unless kept in a directory."""

    __tablename__ = "checkpoints"

    version: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    checksum: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int]
    blob: Mapped[bytes | None] = mapped_column(LargeBinary)
    path: Mapped[str | None] = mapped_column(String(1024))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    rows_trained: Mapped[int]
    n_total: Mapped[int]
    # Set once its stored bytes were found damaged: never loaded, served or pinned again.
    quarantined_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), default=None)
    quarantine_reason: Mapped[str | None] = mapped_column(String(1024), default=None)
    # The evaluation gate (0008, rofu.service.lifecycle.gate): `candidate` (not served yet),
    # `promoted` (servable) or `rejected`; `gate` holds the figures of the decision.
    gate_status: Mapped[str] = mapped_column(String(16), default=PROMOTED, server_default=PROMOTED)
    gate: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class ModelPinRow(Base):
    """The single row saying which checkpoint to serve instead of the newest (None: newest)."""

    __tablename__ = "model_pin"
    __table_args__ = (CheckConstraint("id = 1", name="ck_model_pin_single_row"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False, default=1)
    version: Mapped[int | None] = mapped_column(ForeignKey("checkpoints.version"))
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class TrainerLeaseRow(Base):
    """SQLite's trainer lock (Postgres uses an advisory lock): who trains, and until when."""

    __tablename__ = "trainer_lease"
    __table_args__ = (CheckConstraint("id = 1", name="ck_trainer_lease_single_row"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False, default=1)
    holder: Mapped[str | None] = mapped_column(String(256))
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime())
