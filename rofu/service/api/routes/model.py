"""Read-only model information: GET /model and GET /model/checkpoints."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from rofu.client.schemas import CheckpointInfo, LearnerInfo, ModelResponse, TrainingInfo
from rofu.service.api.decoding import JsonRoute
from rofu.service.api.deps import ClientAuth, SessionsDep, SettingsDep, SnapshotDep
from rofu.service.api.routes import API_PREFIX
from rofu.service.api.schemas import error_responses
from rofu.service.db import repository
from rofu.service.db.tables import CheckpointRow
from rofu.service.settings import Settings

MAX_PAGE = 500
router = APIRouter(
    route_class=JsonRoute,
    prefix=f"{API_PREFIX}/model",
    tags=["model"],
    dependencies=[ClientAuth],
    responses=error_responses(401),
)


@router.get("", response_model=ModelResponse)
async def model_info(snapshot: SnapshotDep, settings: SettingsDep) -> ModelResponse:
    """The served checkpoint, network and ROFU settings, and when the service trains."""
    created = None if snapshot is None else datetime.fromtimestamp(snapshot.created_at, UTC)
    return ModelResponse(
        version=0 if snapshot is None else snapshot.version,
        checksum=None if snapshot is None else snapshot.checksum,
        created_at=created,
        age_seconds=None if snapshot is None else max(time.time() - snapshot.created_at, 0.0),
        n_data=0 if snapshot is None else snapshot.data.n_total,
        network=dataclasses.asdict(
            settings.net_config() if snapshot is None else snapshot.net.config
        ),
        rofu=dataclasses.asdict(settings.rofu_config()),
        feature_hash_seed=settings.feature_hash_seed,
        learner=None if snapshot is None else snapshot.served_learner,
        learners=[]
        if snapshot is None
        else [
            LearnerInfo(name=name, prequential_loss=loss, served=name == snapshot.served_learner)
            for name, loss in snapshot.learners
        ],
        training=_training(settings),
    )


def _training(settings: Settings) -> TrainingInfo:
    """When the service can learn, from its settings."""
    return TrainingInfo(
        trainer="embedded" if settings.in_process_trainer else "external",
        reward_window_seconds=settings.reward_window_seconds,
        train_every_rewards=settings.train_every_rewards,
        train_interval_seconds=settings.train_interval_seconds,
        checkpoint_poll_seconds=settings.checkpoint_poll_seconds,
    )


@router.get("/checkpoints", response_model=list[CheckpointInfo], responses=error_responses(422))
async def checkpoints(
    sessions: SessionsDep,
    request: Request,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="versions per page")] = 50,
    before: Annotated[
        int | None,
        Query(ge=1, le=2**31 - 1, description="only versions below this one (the next page)"),
    ] = None,
) -> list[CheckpointInfo]:
    """Stored checkpoints, newest first, with their evaluation-gate status and figures, one
    page at a time: when older ones exist, the `Link` header names the next page
    (`rel="next"`, RFC 8288)."""
    rows = await run_in_threadpool(repository.list_checkpoints, sessions, limit + 1, before)
    if len(rows) > limit:
        rows = rows[:limit]
        response.headers["Link"] = (
            f'<{request.url.path}?limit={limit}&before={rows[-1].version}>; rel="next"'
        )
    return [checkpoint_info(row) for row in rows]


def checkpoint_info(row: CheckpointRow) -> CheckpointInfo:
    """A stored checkpoint's row as the API shows it."""
    return CheckpointInfo(
        version=row.version,
        created_at=row.created_at,
        checksum=row.checksum,
        size_bytes=row.size_bytes,
        rows_trained=row.rows_trained,
        n_total=row.n_total,
        metrics={k: float(v) for k, v in row.metrics.items()},
        gate_status=row.gate_status,  # type: ignore[arg-type]  # the column's three values
        gate=row.gate,
    )
