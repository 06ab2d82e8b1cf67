"""The load benchmark's in-process side: the reference checkpoint it serves, the served
scoring path (`rofu.models.prepared`) timed in-process on that checkpoint, and the audit of
acknowledged rewards afterwards."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
from sqlalchemy import text

from rofu.models import (
    Checkpoint,
    RegulariserData,
    RewardNet,
    Scores,
    Transitions,
    dump_checkpoint,
    fit,
)
from rofu.models.prepared import score
from rofu.service import migrate
from rofu.service.db import repository
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.deciding.scoring import checkpoint_generator, prepare_served
from rofu.service.deciding.snapshot import Snapshot
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.runtime import resolve_device
from rofu.service.settings import Settings


def seed_checkpoint(settings: Settings, n_data: int, seed: int) -> tuple[int, bytes]:
    """Fit the served network on n_data synthetic rows and store it; (version, blob)."""
    gen = torch.Generator().manual_seed(seed)
    dim, n_arms = settings.context_dim, settings.max_arms
    x = torch.randn(n_data, dim, generator=gen)  # (N, D)
    arms = torch.randint(n_arms, (n_data,), generator=gen)  # (N,)
    weights = torch.randn(n_arms, dim, generator=gen) / math.sqrt(dim)  # (A, D)
    rewards = (x * weights[arms]).sum(1) + 0.1 * torch.randn(n_data, generator=gen)  # (N,)
    sample = Transitions(x, arms, rewards)
    net = RewardNet(settings.net_config())
    metrics = fit(net, sample, settings.fit_config(n_data), gen)  # as a trainer run on them
    migrate.upgrade(settings.database_url)
    engine = make_engine(settings.database_url)
    try:
        sessions = session_factory(engine)
        latest = repository.latest_checkpoint(sessions, with_blob=False)
        version = 1 if latest is None else latest.version + 1
        checkpoint = Checkpoint(
            version=version,
            net_config=settings.net_config(),
            state={k: v.detach() for k, v in net.state_dict().items()},
            data=RegulariserData(sample, n_data, torch.bincount(arms, minlength=n_arms)),
            metrics=metrics,
            extra={"created_at": str(time.time())},
        )
        blob = dump_checkpoint(checkpoint)
        CheckpointStore(sessions).save(
            version, blob, metrics=metrics, rows_trained=n_data, n_total=n_data, consumed=[]
        )
    finally:
        engine.dispose()
    return version, blob


def served_scorer(settings: Settings, blob: bytes) -> Callable[[torch.Tensor], Scores]:
    """What a replica scores a batch of (B, D) contexts with, every arm a candidate: the
    checkpoint loaded (`Snapshot.from_blob`) and prepared once (`prepare_served`), then one
    `score` call with the version's generator, as `rofu.service.deciding.scoring` does."""
    device = resolve_device(settings.device)
    snapshot = Snapshot.from_blob(
        blob, settings.net_config(), device, hash_seed=settings.feature_hash_seed
    )
    prepared = prepare_served(
        snapshot, settings.rofu_config(), settings.seed, cuda_graphs=settings.cuda_graphs
    )

    def scores(contexts: torch.Tensor) -> Scores:
        mask = torch.ones(contexts.shape[0], settings.max_arms, dtype=torch.bool)
        generator = checkpoint_generator(settings.seed, snapshot.version)
        return score(prepared, contexts.to(device), generator, candidates=mask)

    return scores


def inprocess_seconds(
    settings: Settings, blob: bytes, batches: list[int], repeats: int
) -> dict[int, float]:
    """Median seconds of one served scoring call (`served_scorer`) per batch size,
    repetitions interleaved; the checkpoint is prepared once, outside the timing."""
    scorer = served_scorer(settings, blob)
    contexts = {
        b: torch.randn(b, settings.context_dim, generator=torch.Generator().manual_seed(b))
        for b in batches
    }

    def once(b: int) -> float:
        start = time.perf_counter()
        scorer(contexts[b]).ucb.cpu()
        return time.perf_counter() - start

    samples: dict[int, list[float]] = {b: [] for b in batches}
    for repeat in range(repeats + 1):  # the first round warms up
        for b in batches:
            seconds = once(b)
            if repeat:
                samples[b].append(seconds)
    return {b: statistics.median(values) for b, values in samples.items()}


def audit_rewards(database_url: str, acked: dict[str, float]) -> dict[str, int]:
    """Every reward acknowledged with a 2xx must be stored exactly once, with its value."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    "select event_id, count(*), min(value), max(value) from rewards "
                    "group by event_id"
                )
            ).all()
    finally:
        engine.dispose()
    stored = {event_id: (count, low, high) for event_id, count, low, high in rows}
    missing = [e for e in acked if e not in stored]
    duplicated = [e for e, (count, _, _) in stored.items() if count != 1]
    wrong = [e for e, v in acked.items() if e in stored and stored[e][1:] != (v, v)]
    return {
        "acknowledged": len(acked),
        "stored": len(stored),
        "missing": len(missing),
        "duplicated": len(duplicated),
        "wrong_value": len(wrong),
        "unacknowledged_stored": len(set(stored) - set(acked)),
    }
