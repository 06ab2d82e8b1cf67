"""/select as domain logic: validate, then hand the request to the decision batch.

The same `event_id` always returns the first decision stored under it; the same key
with a different request is a 409, never a second decision (`service.decision_batch`).
"""

from __future__ import annotations

import hashlib
import json

from models.scores import ArmScore
from service.batcher import MicroBatcher
from service.db.tables import DecisionRow
from service.deadline import within
from service.decision_batch import Pending, Result
from service.errors import InvalidInput
from service.metrics import ServiceMetrics
from service.reward_metrics import count_selection
from service.schemas import ArmProbability, SelectRequest, SelectResponse
from service.settings import Settings


def request_hash(body: SelectRequest) -> str:
    """A digest of everything that defines the request (not the key itself)."""
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
    canonical = json.dumps(defining, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


async def decide(
    body: SelectRequest,
    settings: Settings,
    batcher: MicroBatcher[Pending, Result],
    metrics: ServiceMetrics,
) -> SelectResponse:
    """Answer one /select request (the batch looks its key up, scores and stores it)."""
    _check_context(body.context, settings.context_dim, settings.max_abs_feature)
    pending = Pending(body, request_hash(body))
    result = await within(settings.request_deadline_seconds, batcher.submit(pending))
    if isinstance(result, Exception):
        raise result
    if result.created:
        count_selection(metrics, result.row, stored_scores(result.row))
        if result.row.deferred:
            metrics.deferred.labels("deferred").inc()
    return response(result.row)


def _check_context(context: list[float], dim: int, limit: float) -> None:
    if len(context) != dim:
        raise InvalidInput(f"context: expected {dim} values, got {len(context)}", field="context")
    beyond = next((i for i, v in enumerate(context) if abs(v) > limit), None)
    if beyond is not None:
        raise InvalidInput(
            f"context.{beyond}: {context[beyond]} is beyond the bound +-{limit:g} "
            "(ROFU_MAX_ABS_FEATURE); scale the feature",
            field=f"context.{beyond}",
        )


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


def response(row: DecisionRow) -> SelectResponse:
    """The API view of a stored decision."""
    return SelectResponse(
        event_id=row.event_id,
        arm=row.arm_id,
        model_version=row.model_version,
        propensity=row.propensity,
        explore=row.explore,
        policy=row.policy,
        scores=stored_scores(row),
        probabilities=None
        if row.probabilities is None
        else [
            ArmProbability(arm=arm, probability=p)
            for arm, p in zip(row.candidates, row.probabilities, strict=True)
        ],
        baseline_arm=row.baseline_arm,
        rofu_arm=row.rofu_arm,
        deferred=row.deferred,
    )
