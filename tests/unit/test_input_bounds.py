"""No input can push training out of floating-point range: API bounds, trainer filters,
and checkpoints with non-finite parameters refused."""

from __future__ import annotations

import math

import pytest
import torch
from sqlalchemy import text

import rofu.service.lifecycle.trainer as trainer_module
from rofu.models import (
    Checkpoint,
    CheckpointError,
    RegulariserData,
    dump_checkpoint,
    load_checkpoint,
)
from rofu.service.db import repository
from rofu.service.lifecycle.trainer import Trainer
from tests.factories import decision_row, make_net, make_transitions
from tests.support import app_client, seed_checkpoint


def _count(app, table: str) -> int:
    with app.state.runtime.engine.connect() as connection:
        return int(connection.execute(text(f"select count(*) from {table}")).scalar_one())


@pytest.mark.anyio
async def test_api_refuses_features_and_rewards_beyond_the_bounds(sqlite_settings):
    settings = sqlite_settings.model_copy(update={"max_abs_feature": 100.0, "max_abs_reward": 10.0})
    async with app_client(settings) as (client, app):
        far = await client.post("/v1/select", json={"context": [1.0, 2.0, -250.0, 0.0]})
        assert far.status_code == 422
        assert far.json()["error"]["field"] == "context.2"
        assert "ROFU_MAX_ABS_FEATURE" in far.json()["error"]["message"]
        assert _count(app, "decisions") == 0
        ok = await client.post("/v1/select", json={"context": [1.0, 2.0, -100.0, 0.0]})
        assert ok.status_code == 200
        big = await client.post(
            "/v1/reward", json={"event_id": ok.json()["event_id"], "value": 1e9}
        )
        assert (big.status_code, big.json()["error"]["field"]) == (422, "value")
        assert _count(app, "rewards") == 0
        fine = await client.post(
            "/v1/reward", json={"event_id": ok.json()["event_id"], "value": -10}
        )
        assert fine.status_code == 200


@pytest.mark.anyio
async def test_trainer_excludes_rows_beyond_the_bounds(sqlite_settings):
    async with app_client(sqlite_settings) as (_, app):
        runtime = app.state.runtime
        rows = {
            "ok": ([0.1, 0.2, 0.3, 0.4], 1.0),
            "far": ([1e7, 0.0, 0.0, 0.0], 1.0),
            "big": ([0.1, 0.2, 0.3, 0.4], 1e9),
        }
        for event_id, (context, _) in rows.items():
            repository.save_decision(runtime.sessions, decision_row(event_id, context))
        for event_id, (_, value) in rows.items():  # stored before a bound existed
            with runtime.engine.begin() as connection:
                connection.execute(
                    text(
                        "insert into rewards (event_id, value, received_at, repeats) values "
                        "(:e, :v, '2026-01-01 00:00:00', 0)"
                    ),
                    {"e": event_id, "v": value},
                )
        report = Trainer(
            sqlite_settings, runtime.sessions, runtime.store, runtime.local_bus
        ).run_once()
    assert (report.rewarded, report.excluded, report.consumed) == (1, 2, 3)


@pytest.mark.anyio
async def test_trainer_never_publishes_a_diverged_model(sqlite_settings, monkeypatch):
    def diverge(net, *args, **kwargs):
        with torch.no_grad():
            next(net.parameters()).fill_(float("nan"))
        return {"loss": float("nan")}

    monkeypatch.setattr(trainer_module, "fit", diverge)
    settings = sqlite_settings.model_copy(update={"learners": ("mlp",)})  # one learner, no reset
    async with app_client(settings) as (client, app):
        runtime = app.state.runtime
        chosen = await client.post("/v1/select", json={"context": [0.1, 0.2, 0.3, 0.4]})
        await client.post("/v1/reward", json={"event_id": chosen.json()["event_id"], "value": 1.0})
        trainer = Trainer(settings, runtime.sessions, runtime.store, runtime.local_bus)
        with pytest.raises(RuntimeError, match="diverged"):
            trainer.run_once()
        assert repository.latest_checkpoint(runtime.sessions) is None
        assert len(repository.closed_decisions(runtime.sessions, repository.utcnow(), 10)) == 1


def test_checkpoint_with_non_finite_parameters_is_refused():
    net = make_net(3, 2, hidden=(4,))
    state = {k: v.clone() for k, v in net.state_dict().items()}
    state["layers.0.weight"][0, 0] = float("inf")
    sample = make_transitions(6, 3, 2)
    data = RegulariserData(sample, 6, sample.arms.bincount(minlength=2))
    blob = dump_checkpoint(Checkpoint(1, net.config, state, data))
    with pytest.raises(CheckpointError, match="non-finite"):
        load_checkpoint(blob)


@pytest.mark.anyio
async def test_every_accepted_context_is_scored_clamped_into_the_networks_range(sqlite_settings):
    """A context far outside the training data (here 1e30, with the bound raised to it) is
    scored clamped into the range the network was trained on; it used to overflow into
    "scores not finite" (422) already inside the documented bound of 1e6."""
    settings = sqlite_settings.model_copy(update={"max_abs_feature": 1e30})
    seed_checkpoint(settings, n_rows=50)
    async with app_client(settings) as (client, app):
        for value in (1e6, -1e6, 1e30):
            far = await client.post("/v1/select", json={"context": [value, 0.1, -value, 0.4]})
            assert far.status_code == 200, far.text
            assert far.json()["policy"] == "rofu"
            assert all(math.isfinite(s["ucb"]) for s in far.json()["scores"])
        snapshot = app.state.runtime.holder.current
        far_away = torch.tensor([[1e30, 0.1, -1e30, 0.4]])
        clamped = snapshot.bounded(far_away)[0]
        assert clamped[0] == snapshot.context_high[0]
        assert clamped[2] == snapshot.context_low[2]
        assert clamped[1] == far_away[0, 1]  # inside the range: unchanged
        row = repository.find_decision(app.state.runtime.sessions, far.json()["event_id"])
        assert row.context[0] == 1e30  # the log keeps what was asked


@pytest.mark.anyio
async def test_scores_that_overflow_are_refused_not_chosen(sqlite_settings):
    """A network that overflows even on its own data's range gets a 422 (choosing among
    NaNs once picked a non-candidate arm), and nothing is logged."""
    seed_checkpoint(sqlite_settings, n_rows=50, weight_scale=1e20)
    async with app_client(sqlite_settings) as (client, app):
        huge = await client.post("/v1/select", json={"context": [0.1, 0.2, 0.3, 0.4]})
        assert huge.status_code == 422
        assert "not finite" in huge.json()["error"]["message"]
        assert _count(app, "decisions") == 0
