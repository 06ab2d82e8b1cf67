"""/select as domain logic: validate, then hand the request to the decision batch.

The same `event_id` always returns the first decision stored under it; the same key
with a different request is a 409, never a second decision (`rofu.service.deciding.batch`).
Named features (the context, per-request arm features) are hashed here into the vectors
the model reads (`rofu.service.deciding.features`), which then pass the same checks as dense ones.
"""

from __future__ import annotations

import hashlib
import json

from starlette.concurrency import run_in_threadpool

from rofu.client import schemas as wire
from rofu.client.schemas import ArmExplanation, ArmProbability, SelectResponse
from rofu.models.scores import ArmScore
from rofu.service.api.deadline import within
from rofu.service.api.schemas import SelectRequest
from rofu.service.db.tables import DecisionRow
from rofu.service.deciding import features
from rofu.service.deciding.batch import Pending, Result
from rofu.service.deciding.batcher import MicroBatcher
from rofu.service.errors import InvalidInput
from rofu.service.metrics import ServiceMetrics
from rofu.service.rewards.metrics import count_selection
from rofu.service.settings import Settings


def request_hash(body: SelectRequest) -> str:
    """A digest of everything that defines the request (not the key itself).

    Named features are digested as validated (numbers as floats) with their keys sorted:
    the same named context in another key order is the same request. A request without
    per-request arm features has the digest it had before they existed.
    """
    defining: dict[str, object] = {
        "context": body.context,
        "arms": body.arms,
        "exclude": sorted(set(body.exclude or ())),  # omitted == [] == same ids reordered
        "explore": body.explore,
    }
    # hashed only when given: the digests stored before these fields existed still match
    if body.baseline_arm is not None:
        defining["baseline_arm"] = body.baseline_arm
    if body.defer:
        defining["defer"] = True
    if body.unit_id is not None:
        defining["unit_id"] = body.unit_id
    if body.arm_features:  # omitted == {}
        defining["arm_features"] = body.arm_features
    canonical = json.dumps(defining, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


async def decide(
    body: SelectRequest,
    settings: Settings,
    batcher: MicroBatcher[Pending, Result],
    metrics: ServiceMetrics,
) -> SelectResponse:
    """Answer one /select request (the batch looks its key up, scores and stores it)."""
    context, arm_features = await request_vectors(body, settings)
    pending = Pending(body, request_hash(body), context, arm_features)
    result = await within(settings.request_deadline_seconds, batcher.submit(pending))
    if isinstance(result, Exception):
        raise result
    if result.created:
        count_selection(metrics, result.row, stored_scores(result.row))
        if result.row.deferred:
            metrics.deferred.labels("deferred").inc()
    return response(result.row, result.explanations)


async def request_vectors(
    body: SelectRequest, settings: Settings
) -> tuple[tuple[float, ...], dict[str, tuple[float, ...]]]:
    """`vectors`, off the event loop when there is hashing to do."""
    if isinstance(body.context, dict) or body.arm_features:
        return await run_in_threadpool(vectors, body, settings)
    return vectors(body, settings)


def vectors(
    body: SelectRequest, settings: Settings
) -> tuple[tuple[float, ...], dict[str, tuple[float, ...]]]:
    """The context vector and the per-request arm feature vectors the model reads: dense
    ones checked, named ones hashed (`ROFU_FEATURE_HASH_SEED`) and checked.

    Raises:
        InvalidInput: a vector of another length, a value beyond ROFU_MAX_ABS_FEATURE, or
            per-request arm features for a model with one output per arm; the field
            names the offending value (`context.user.age`, `arm_features.arm-1.3`).
    """
    if body.arm_features and not settings.arm_feature_dim:
        raise InvalidInput(
            "arm_features: the model has one output per arm and reads no arm features "
            "(ROFU_ARM_FEATURE_DIM is 0); omit them",
            field="arm_features",
        )
    seed, bound = settings.feature_hash_seed, settings.max_abs_feature
    try:
        context = features.to_vector(body.context, settings.context_dim, seed, max_abs=bound)
        arm_features = {
            arm: tuple(
                features.to_vector(
                    value, settings.arm_feature_dim, seed, max_abs=bound, path=f"arm_features.{arm}"
                )
            )
            for arm, value in (body.arm_features or {}).items()
        }
    except features.FeatureError as exc:
        raise InvalidInput(str(exc), field=exc.field) from exc
    return tuple(context), arm_features


def stored_scores(row: DecisionRow) -> list[ArmScore]:
    """A decision row's per-candidate scores, in the candidates' order.

    Rows hold a list of `ArmScore` objects; rows written before 2026-11-25 hold a dict of
    arm id -> [mean, bonus, ucb] (null on a cold start), read the same way.
    """
    if isinstance(row.scores, list):
        return [ArmScore(**score) for score in row.scores]
    legacy = [row.scores.get(arm) for arm in row.candidates]
    return [
        ArmScore.unscored(arm) if values is None else ArmScore(arm, *values)
        for arm, values in zip(row.candidates, legacy, strict=True)
    ]


def response(row: DecisionRow, explanations: list[ArmExplanation] | None = None) -> SelectResponse:
    """The API view of a stored decision (with its explanations when computed)."""
    return SelectResponse(
        event_id=row.event_id,
        arm=row.arm_id,
        model_version=row.model_version,
        propensity=row.propensity,
        explore=row.explore,
        policy=row.policy,
        scores=[wire.ArmScore.model_validate(score) for score in stored_scores(row)],
        probabilities=None
        if row.probabilities is None
        else [
            ArmProbability(arm=arm, probability=p)
            for arm, p in zip(row.candidates, row.probabilities, strict=True)
        ],
        baseline_arm=row.baseline_arm,
        rofu_arm=row.rofu_arm,
        experiment=row.experiment,
        deferred=row.deferred,
        explanations=explanations,
    )
