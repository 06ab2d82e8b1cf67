"""Dependencies of the route handlers, as `Annotated` aliases.

Each gives a handler one part of the process's `Runtime` (built by the app's lifespan),
so no handler reaches through the whole runtime. They are `async def` because they never
block: FastAPI would run a plain `def` dependency in the thread pool, a needless hop on
every request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from rofu.service.api.security import (
    SUBSCRIBER_KEY_HEADERS,
    SUBSCRIPTION_KEY_HEADER,
    KeyRing,
    authorise,
)
from rofu.service.db.engine import SessionFactory
from rofu.service.db.faults import DatabaseStatus
from rofu.service.deciding.batch import Pending, Result
from rofu.service.deciding.batcher import MicroBatcher
from rofu.service.deciding.catalogue import CatalogueCache
from rofu.service.deciding.snapshot import Snapshot
from rofu.service.lifecycle.follower import CheckpointFollower
from rofu.service.lifecycle.redis_bus import RedisBus
from rofu.service.metrics import ServiceMetrics
from rofu.service.rewards.record import RewardBatcher
from rofu.service.runtime import Runtime
from rofu.service.settings import Settings


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def get_app_settings(request: Request) -> Settings:
    """The settings the app was built with."""
    return _runtime(request).settings


async def get_sessions(request: Request) -> SessionFactory:
    """The database session factory."""
    return _runtime(request).sessions


async def get_catalogue(request: Request) -> CatalogueCache:
    """The cached arm catalogue."""
    return _runtime(request).catalogue


async def get_metrics(request: Request) -> ServiceMetrics:
    """The process's Prometheus metrics."""
    return _runtime(request).metrics


async def get_batcher(request: Request) -> MicroBatcher[Pending, Result]:
    """The micro-batcher that scores and stores /select requests."""
    return _runtime(request).batcher


async def get_reward_batcher(request: Request) -> RewardBatcher:
    """The micro-batcher that stores rewards, one transaction per batch."""
    return _runtime(request).reward_batcher


async def get_snapshot(request: Request) -> Snapshot | None:
    """The snapshot served at the time of the request (None before any checkpoint)."""
    return _runtime(request).holder.current


async def get_follower(request: Request) -> CheckpointFollower:
    """The checkpoint follower: model state, sync, pin and unpin."""
    return _runtime(request).follower


async def get_database_check(request: Request) -> Callable[[], Awaitable[DatabaseStatus]]:
    """The readiness probe of the database (reads and writes), bounded in time."""
    return _runtime(request).check_database


async def get_redis_bus(request: Request) -> RedisBus | None:
    """The Redis checkpoint bus (None in embedded mode without Redis)."""
    return _runtime(request).redis


async def get_keys(request: Request) -> KeyRing:
    """The API keys the service accepts."""
    return _runtime(request).keys


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
SessionsDep = Annotated[SessionFactory, Depends(get_sessions)]
CatalogueDep = Annotated[CatalogueCache, Depends(get_catalogue)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
BatcherDep = Annotated[MicroBatcher[Pending, Result], Depends(get_batcher)]
RewardBatcherDep = Annotated[RewardBatcher, Depends(get_reward_batcher)]
SnapshotDep = Annotated[Snapshot | None, Depends(get_snapshot)]
FollowerDep = Annotated[CheckpointFollower, Depends(get_follower)]
DatabaseCheckDep = Annotated[Callable[[], Awaitable[DatabaseStatus]], Depends(get_database_check)]
KeysDep = Annotated[KeyRing, Depends(get_keys)]
RedisBusDep = Annotated[RedisBus | None, Depends(get_redis_bus)]


#: Declares the scheme in the OpenAPI document (so /docs can authorise and generated
#: clients send the key); `authorise` does the checking, with the service's own errors.
BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="apiKey",
    description="A client or admin API key: `Authorization: Bearer <key>`",
)
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]


#: Personalizer's key header, declared for the Personalizer-compatible facade's routes.
SUBSCRIPTION_KEY = APIKeyHeader(
    name=SUBSCRIPTION_KEY_HEADER,
    auto_error=False,
    scheme_name="subscriptionKey",
    description="A client or admin API key in Personalizer's header (the Personalizer-"
    "compatible routes only): `Ocp-Apim-Subscription-Key: <key>`",
)
SubscriptionKey = Annotated[str | None, Security(SUBSCRIPTION_KEY)]


async def require_client(request: Request, keys: KeysDep, _: Bearer) -> None:
    """A client (or admin) API key, unless the service runs without keys."""
    authorise(keys, request, admin=False)


async def require_admin(request: Request, keys: KeysDep, _: Bearer) -> None:
    """An admin API key, unless the service runs without keys."""
    authorise(keys, request, admin=True)


async def require_subscriber(
    request: Request, keys: KeysDep, _: Bearer, __: SubscriptionKey
) -> None:
    """A client (or admin) API key as a bearer token or in Personalizer's header."""
    authorise(keys, request, admin=False, headers=SUBSCRIBER_KEY_HEADERS)


ClientAuth = Depends(require_client)
AdminAuth = Depends(require_admin)
SubscriberAuth = Depends(require_subscriber)
