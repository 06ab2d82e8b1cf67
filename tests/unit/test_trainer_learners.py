"""The service's trainer with a learner family (ROFU_LEARNERS): every candidate scores the
new rows before it is refitted on them, the checkpoint keeps each candidate and its loss,
the next run (in another process too) continues them, and GET /v1/model and the metrics
say which one is served."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from rofu.models import Checkpoint, CheckpointError, dump_checkpoint, load_checkpoint
from rofu.models.checkpoint import CandidateState
from rofu.models.data import Prequential, RegulariserData, Transitions
from rofu.models.networks import RewardNet
from rofu.service.deciding.snapshot import Snapshot
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.metrics import ServiceMetrics
from tests.support import app_client

FAMILY = ("mlp", "sgd-decay", "linear")


async def _linear_rewards(client: Any, n: int, seed: int) -> None:
    """`n` decisions whose reward is linear in the context (arm 0: x0, arm 1: -x0)."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(4, generator=generator).tolist()
        chosen = (await client.post("/v1/select", json={"context": x})).json()
        sign = 1.0 if chosen["arm"] == "arm-0" else -1.0
        value = sign * x[0] + 0.1 * float(torch.randn(1, generator=generator))
        await client.post("/v1/reward", json={"event_id": chosen["event_id"], "value": value})


def _gauge(metrics: ServiceMetrics, name: str, learner: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"learner": learner})


@pytest.mark.anyio
async def test_trainer_keeps_every_candidate_and_serves_the_lowest_loss(sqlite_settings):
    settings = sqlite_settings.model_copy(update={"learners": FAMILY})
    async with app_client(settings) as (client, app):
        runtime = app.state.runtime
        metrics = ServiceMetrics()
        trainer = Trainer(settings, runtime.sessions, runtime.store, runtime.local_bus, metrics)
        weights = []
        for run in range(3):
            await _linear_rewards(client, 20, seed=run)
            assert trainer.run_once() is not None
            checkpoint = load_checkpoint(runtime.store.latest()[1])
            weights.append({c.name: c.loss.weight for c in checkpoint.candidates})
        # a trainer in another process continues the candidates from the checkpoint
        await _linear_rewards(client, 20, seed=3)
        restarted = Trainer(settings, runtime.sessions, runtime.store, runtime.local_bus)
        assert restarted.run_once() is not None
        checkpoint = load_checkpoint(runtime.store.latest()[1])
        model = (await client.get("/v1/model")).json()

    assert [c.name for c in checkpoint.candidates] == list(FAMILY)
    losses = {c.name: c.loss.variance for c in checkpoint.candidates}
    assert checkpoint.served_learner == min(losses, key=lambda n: losses[n])
    served = next(c for c in checkpoint.candidates if c.name == checkpoint.served_learner)
    assert all(torch.equal(checkpoint.state[k], v) for k, v in served.state.items())
    assert [c.net_config.hidden for c in checkpoint.candidates] == [(16,), (16,), ()]
    # each run's 20 rows were folded into every candidate's loss: none started over
    for before, after in zip(weights, weights[1:], strict=False):
        assert all(after[n] > before[n] for n in FAMILY)
    assert all(checkpoint.candidates[i].loss.weight > weights[-1][n] for i, n in enumerate(FAMILY))
    assert {f"loss/{n}" for n in FAMILY} <= set(checkpoint.metrics)
    assert model["version"] == checkpoint.version
    assert model["learner"] == checkpoint.served_learner
    assert [(m["name"], m["served"]) for m in model["learners"]] == [
        (n, n == checkpoint.served_learner) for n in FAMILY
    ]
    assert model["learners"][0]["prequential_loss"] == pytest.approx(losses["mlp"])
    assert _gauge(metrics, "rofu_learner_served", checkpoint.served_learner) is not None


@pytest.mark.anyio
async def test_trainer_metrics_name_each_candidates_loss_and_the_served_one(sqlite_settings):
    settings = sqlite_settings.model_copy(update={"learners": FAMILY})
    async with app_client(settings) as (client, app):
        runtime = app.state.runtime
        metrics = ServiceMetrics()
        trainer = Trainer(settings, runtime.sessions, runtime.store, runtime.local_bus, metrics)
        for run in range(2):
            await _linear_rewards(client, 20, seed=run)
            trainer.run_once()
        checkpoint = load_checkpoint(runtime.store.latest()[1])
    for candidate in checkpoint.candidates:
        loss = _gauge(metrics, "rofu_learner_prequential_loss", candidate.name)
        assert loss == pytest.approx(candidate.loss.variance)
        served = _gauge(metrics, "rofu_learner_served", candidate.name)
        assert served == (1.0 if candidate.name == checkpoint.served_learner else 0.0)


@pytest.mark.anyio
async def test_a_checkpoint_without_a_family_is_continued_as_its_mlp(sqlite_settings):
    family = sqlite_settings.model_copy(update={"learners": FAMILY})
    alone = sqlite_settings.model_copy(update={"learners": ("mlp",)})
    async with app_client(family) as (client, app):  # replicas that serve any candidate
        runtime = app.state.runtime
        await _linear_rewards(client, 20, seed=0)
        Trainer(alone, runtime.sessions, runtime.store, runtime.local_bus).run_once()
        single = load_checkpoint(runtime.store.latest()[1])
        await _linear_rewards(client, 20, seed=1)
        Trainer(family, runtime.sessions, runtime.store, runtime.local_bus).run_once()
        continued = load_checkpoint(runtime.store.latest()[1])
        model = (await client.get("/v1/model")).json()
    assert single.candidates == ()
    assert single.served_learner is None
    weights = {c.name: c.loss.weight for c in continued.candidates}
    assert single.data.noise is not None
    assert weights["mlp"] > 20  # the single MLP's 20 rows, then these 20
    assert weights["linear"] == pytest.approx(20, rel=0.05)  # a new candidate: these rows only
    assert model["learner"] == continued.served_learner


def _family_checkpoint(served: str) -> tuple[Checkpoint, Any]:
    from rofu.service.settings import Settings

    settings = Settings(
        _env_file=None, database_url="sqlite:///x.sqlite", context_dim=4, learners=FAMILY
    )
    states = []
    for config in settings.served_net_configs():
        net = RewardNet(config)
        states.append((config, {k: v.detach().clone() for k, v in net.state_dict().items()}))
    names = dict(zip(FAMILY, states, strict=True))
    candidates = tuple(
        CandidateState(n, c, s, Prequential(1.0, 2.0)) for n, (c, s) in names.items()
    )
    sample = Transitions(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), torch.zeros(0))
    config, state = names[served]
    checkpoint = Checkpoint(
        version=1,
        net_config=config,
        state=state,
        data=RegulariserData(sample, 0, torch.zeros(settings.max_arms, dtype=torch.long)),
        candidates=candidates,
        served_learner=served,
    )
    return checkpoint, settings


def test_a_replica_serves_a_checkpoint_whose_linear_candidate_won():
    checkpoint, settings = _family_checkpoint("linear")
    blob = dump_checkpoint(checkpoint)
    snapshot = Snapshot.from_blob(
        blob, settings.served_net_configs(), torch.device("cpu"), hash_seed=0
    )
    assert snapshot.net.config.hidden == ()
    assert snapshot.served_learner == "linear"
    assert [name for name, _ in snapshot.learners] == list(FAMILY)
    with pytest.raises(CheckpointError, match="does not match the served structure"):
        load_checkpoint(blob, expect=settings.net_config())  # the MLP's structure alone


def test_a_checkpoint_whose_served_learner_is_not_a_candidate_is_refused():
    checkpoint, _ = _family_checkpoint("mlp")
    with pytest.raises(CheckpointError, match="served learner 'tree'"):
        load_checkpoint(dump_checkpoint(dataclasses.replace(checkpoint, served_learner="tree")))


def test_a_damaged_candidate_is_refused():
    checkpoint, _ = _family_checkpoint("mlp")
    linear = checkpoint.candidates[2]
    bad = dict(linear.state)
    bad[next(iter(bad))] = torch.full_like(next(iter(bad.values())), float("nan"))
    damaged = dataclasses.replace(
        checkpoint, candidates=(*checkpoint.candidates[:2], dataclasses.replace(linear, state=bad))
    )
    with pytest.raises(CheckpointError, match="candidate linear: parameter"):
        load_checkpoint(dump_checkpoint(damaged))
