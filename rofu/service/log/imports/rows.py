"""An imported `Event` as the rows the service would have stored for it.

Named features are hashed exactly as `/v1/select` hashes them (`rofu.service.deciding.
features.to_vector`: `ROFU_FEATURE_HASH_SEED`, `ROFU_CONTEXT_DIM`, `ROFU_ARM_FEATURE_DIM`,
bounded by `ROFU_MAX_ABS_FEATURE`); dense ones must have the deployment's dimension. An
imported decision is marked `policy` "imported" and model version 0 (no rofu model made
it), keeps the named context as the file gave it, rofu's per-arm scores when the file is
rofu's export (else unscored), and the digest of its line as the request digest (a
/v1/select that reuses the event id is then a conflict, never a replay of it).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rofu.models.scores import ArmScore
from rofu.service.db.tables import DecisionRow, RewardRow
from rofu.service.deciding import features
from rofu.service.log.imports.dsjson import DsjsonError, Event, Features, timestamp
from rofu.service.settings import Settings

IMPORTED = "imported"


@dataclass(frozen=True)
class Vectors:
    """An event's hashed context and arm features, and its named context as given."""

    context: list[float]
    named: dict[str, Any] | None
    arm_features: dict[str, list[float]]  # arm id -> features, for the actions that gave some


def vectors(event: Event, settings: Settings) -> Vectors:
    """The vectors the model reads for `event`.

    Raises:
        DsjsonError: a dense vector of another dimension (naming the setting), or a
            feature `/v1/select` would refuse.
    """
    context = _vector(event.context, settings.context_dim, "context", settings)
    own: dict[str, list[float]] = {}
    if settings.arm_feature_dim:
        for action in event.actions:
            if action.features is not None:
                where = f"arm_features.{action.arm}"
                own[action.arm] = _vector(
                    action.features, settings.arm_feature_dim, where, settings
                )
    named = event.context if isinstance(event.context, dict) else None
    return Vectors(context, None if named is None else features.normalise(named), own)


def _vector(value: Features, dim: int, where: str, settings: Settings) -> list[float]:
    if isinstance(value, list) and len(value) != dim:
        setting = "ROFU_CONTEXT_DIM" if where == "context" else "ROFU_ARM_FEATURE_DIM"
        raise DsjsonError(
            f"{where}: {len(value)} dense values, but this deployment reads {dim} "
            f"({setting}={dim}); import with the setting the log was made with"
        )
    try:
        return features.to_vector(
            value, dim, settings.feature_hash_seed, max_abs=settings.max_abs_feature, path=where
        )
    except features.FeatureError as exc:
        raise DsjsonError(str(exc)) from exc


def decision_rows(
    event: Event, found: Vectors, slots: dict[str, int], line: str
) -> tuple[DecisionRow, RewardRow | None]:
    """The decision row of `event` (and its reward row, if rewarded); `slots`: arm id ->
    catalogue slot, every candidate's included."""
    arms = [action.arm for action in event.actions]
    chosen = arms[event.chosen]
    activated = event.created_at if event.activated else None
    stated = event.extension.get("activated_at")
    if activated is not None and isinstance(stated, str):
        activated = max(_moment(stated, event), event.created_at)
    decision = DecisionRow(
        event_id=event.event_id,
        created_at=event.created_at,
        context=found.context,
        candidates=arms,
        arm_id=chosen,
        slot=slots[chosen],
        propensity=event.propensity,
        probabilities=event.probabilities,
        model_version=0,
        explore=event.extension.get("explore", True) is not False,
        policy=IMPORTED,
        scores=_scores(event, arms),
        request_hash=hashlib.sha256(line.encode("utf-8")).hexdigest(),
        named_context=found.named,
        arm_features=found.arm_features or None,
        deferred=event.deferred,
        activated_at=activated,
        activation_late=event.skip_learn and event.activated,
    )
    if event.reward is None:
        return decision, None
    late = event.extension.get("late") is True
    return decision, RewardRow(
        event_id=event.event_id, value=event.reward, received_at=event.created_at, late=late
    )


def _moment(text: str, event: Event) -> datetime:
    try:
        return timestamp(text)
    except DsjsonError:
        return event.created_at


def _scores(event: Event, arms: list[str]) -> list[dict[str, Any]]:
    """rofu's export's per-arm scores when they are the candidates', else unscored ones."""
    given = event.extension.get("scores")
    if isinstance(given, list) and [s.get("arm") for s in given if isinstance(s, dict)] == arms:
        try:
            return [dataclasses.asdict(ArmScore(**score)) for score in given]
        except TypeError:
            pass
    return [dataclasses.asdict(ArmScore.unscored(arm)) for arm in arms]
