"""/select as domain logic: validate, honour the idempotency key, score, persist.

The same `event_id` always returns the first decision stored under it; the same key
with a different request is a 409, never a second decision.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Protocol

from starlette.concurrency import run_in_threadpool

from service.batcher import MicroBatcher
from service.catalogue import CatalogueCache
from service.db import repository
from service.db.engine import SessionFactory
from service.db.tables import DecisionRow
from service.errors import Conflict, InvalidInput
from service.metrics import ServiceMetrics
from service.schemas import ArmScore, SelectRequest, SelectResponse
from service.scoring import SelectJob, SelectOutcome
from service.settings import Settings


class DecisionContext(Protocol):
    """What deciding needs from the runtime."""

    context_dim: int
    settings: Settings
    sessions: SessionFactory
    catalogue: CatalogueCache
    batcher: MicroBatcher[SelectJob, SelectOutcome | None]
    metrics: ServiceMetrics


def request_hash(body: SelectRequest) -> str:
    """A digest of everything that defines the request (not the key itself)."""
    canonical = json.dumps(
        {
            "context": body.context,
            "arms": body.arms,
            "exclude": sorted(set(body.exclude or ())),  # omitted == [] == same ids reordered
            "explore": body.explore,
        },
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


async def decide(runtime: DecisionContext, body: SelectRequest) -> SelectResponse:
    """Answer one /select request."""
    if len(body.context) != runtime.context_dim:
        raise InvalidInput(
            f"context: expected {runtime.context_dim} values, got {len(body.context)}",
            field="context",
        )
    limit = runtime.settings.max_abs_feature
    beyond = next((i for i, v in enumerate(body.context) if abs(v) > limit), None)
    if beyond is not None:
        raise InvalidInput(
            f"context.{beyond}: {body.context[beyond]} is beyond the bound +-{limit:g} "
            "(ROFU_MAX_ABS_FEATURE); scale the feature",
            field=f"context.{beyond}",
        )
    digest = request_hash(body)
    if body.event_id is not None:
        stored = await run_in_threadpool(repository.find_decision, runtime.sessions, body.event_id)
        if stored is not None:
            return _replay(stored, digest)
    catalogue = await run_in_threadpool(runtime.catalogue.fresh)
    candidates = catalogue.candidates(body.arms, body.exclude)
    job = SelectJob(tuple(body.context), tuple(candidates), body.explore)
    outcome = await runtime.batcher.submit(job)
    if outcome is None:
        raise InvalidInput(
            "context: the model's scores for this context are not finite (values out of range)",
            field="context",
        )
    row = _row(body.event_id or uuid.uuid4().hex, job, outcome, digest)
    saved, created = await run_in_threadpool(repository.save_decision, runtime.sessions, row)
    if not created:  # the same key won a race on another request or replica
        return _replay(saved, digest)
    runtime.metrics.selections.labels(outcome.arm.id, outcome.policy).inc()
    return response(saved)


def _replay(stored: DecisionRow, digest: str) -> SelectResponse:
    if stored.request_hash != digest:
        raise Conflict(
            f"event_id {stored.event_id!r} was already used for a different request",
            field="event_id",
        )
    return response(stored)


def _row(event_id: str, job: SelectJob, outcome: SelectOutcome, digest: str) -> DecisionRow:
    scores = {
        arm.id: None
        if outcome.scores is None
        else [outcome.scores[arm.id].mean, outcome.scores[arm.id].bonus, outcome.scores[arm.id].ucb]
        for arm in job.candidates
    }
    return DecisionRow(
        event_id=event_id,
        context=list(job.context),
        candidates=[arm.id for arm in job.candidates],
        arm_id=outcome.arm.id,
        slot=outcome.arm.slot,
        propensity=outcome.propensity,
        model_version=outcome.model_version,
        explore=job.explore,
        policy=outcome.policy,
        scores=scores,
        request_hash=digest,
    )


def response(row: DecisionRow) -> SelectResponse:
    """The API view of a stored decision."""
    scores = []
    for arm_id in row.candidates:
        values = row.scores.get(arm_id)
        mean, bonus, ucb = values if values is not None else (None, None, None)
        scores.append(ArmScore(arm=arm_id, mean=mean, bonus=bonus, ucb=ucb))
    return SelectResponse(
        event_id=row.event_id,
        arm=row.arm_id,
        model_version=row.model_version,
        propensity=row.propensity,
        explore=row.explore,
        policy=row.policy,
        scores=scores,
    )
