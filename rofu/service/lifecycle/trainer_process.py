"""`rofu trainer`: the trainer as its own process (production).

Start-up waits for the database with retries, then runs the trainer loop until
SIGTERM/SIGINT, finishing the run in progress. A kill at any moment is safe: a run commits
its checkpoint and the decisions it consumed in one transaction. Redis is not waited for:
it is a fast path, and the database the truth. While it is down every checkpoint is still
stored, replicas find it by polling the database, and the first publish after Redis
answers again (the next run's) moves them back to the fast path.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import start_http_server
from sqlalchemy import Engine

from rofu.service import migrate
from rofu.service.db.engine import make_engine, ping, session_factory
from rofu.service.lifecycle.bus import CheckpointBus, NullBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.redis_bus import RedisBus
from rofu.service.lifecycle.schedule import TrainerLoop
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.metrics import ServiceMetrics
from rofu.service.settings import Settings
from rofu.service.threads import apply_torch_threads

log = logging.getLogger("rofu.worker")
T = TypeVar("T")


def retry(what: str, attempt: Callable[[], T], timeout_s: float) -> T:
    """Call `attempt` until it succeeds, backing off up to 5 s, for at most `timeout_s`."""
    deadline, delay = time.monotonic() + timeout_s, 0.2
    while True:
        try:
            return attempt()
        except Exception as exc:
            if time.monotonic() + delay > deadline:
                raise RuntimeError(f"{what} not available after {timeout_s:.0f}s: {exc}") from exc
            log.warning("waiting for %s (%s)", what, exc)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _database(settings: Settings) -> Engine:
    engine = make_engine(settings.database_url)
    retry("the database", lambda: ping(engine), settings.startup_timeout_seconds)
    current, head = migrate.current_revision(engine), migrate.head_revision()
    if current != head:
        raise RuntimeError(f"database schema is at {current}, expected {head}: run `rofu migrate`")
    return engine


def _bus(settings: Settings) -> CheckpointBus:
    if settings.redis_url is None:
        log.warning("no redis_url: replicas will find checkpoints by polling the database")
        return NullBus()
    bus = RedisBus.of(settings)
    if not bus.ping():
        log.warning(
            "Redis does not answer; training anyway: replicas find checkpoints by polling "
            "the database until a publish reaches Redis"
        )
    return bus


def run_trainer(settings: Settings, *, once: bool = False) -> int:
    """Run the trainer until stopped (or one run with `once`)."""
    apply_torch_threads(settings.torch_threads)
    engine = _database(settings)
    sessions = session_factory(engine)
    metrics = ServiceMetrics()
    if settings.trainer_metrics_port and not once:
        start_http_server(
            settings.trainer_metrics_port, addr=settings.host, registry=metrics.registry
        )
    limit = settings.checkpoint_byte_limit()
    store = CheckpointStore(sessions, settings.checkpoint_dir, metrics, max_bytes=limit)
    trainer = Trainer(settings, sessions, store, _bus(settings), metrics)
    if once:
        report = trainer.run_once()
        print("nothing to train on" if report is None else report)
        return 0
    loop = TrainerLoop(trainer, sessions)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: loop.request_stop())
    log.info("trainer started")
    loop.run_forever()
    log.info("trainer stopped")
    engine.dispose()
    return 0
