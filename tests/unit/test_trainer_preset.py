"""The trainer runs the preset's learner: steps per new row, the optimizer carried over
while it continues its own checkpoint, and the configuration recorded in each checkpoint."""

from __future__ import annotations

import json
from typing import Any

import pytest

import rofu.service.lifecycle.trainer as trainer_module
from rofu.models import load_checkpoint
from rofu.models.presets import PRODUCT
from rofu.service.lifecycle.trainer import Trainer
from tests.support import app_client


async def _rewarded(client: Any, n: int) -> None:
    for i in range(n):
        chosen = await client.post("/v1/select", json={"context": [0.1 * i, 0.2, 0.3, 0.4]})
        await client.post("/v1/reward", json={"event_id": chosen.json()["event_id"], "value": 1.0})


@pytest.mark.anyio
async def test_trainer_keeps_its_optimizer_only_while_continuing_its_own_checkpoint(
    sqlite_settings, monkeypatch
):
    calls: list[tuple[Any, int]] = []
    real_fit = trainer_module.fit

    def recording(net, data, config, generator, **kwargs):
        calls.append((kwargs["optimizer"], config.steps))
        return real_fit(net, data, config, generator, **kwargs)

    monkeypatch.setattr(trainer_module, "fit", recording)
    settings = sqlite_settings.model_copy(
        update={"fit_steps": None, "fit_steps_per_row": 3.0, "learners": ("mlp",)}
    )
    async with app_client(settings) as (client, app):
        runtime = app.state.runtime
        one = Trainer(settings, runtime.sessions, runtime.store, runtime.local_bus)
        two = Trainer(settings, runtime.sessions, runtime.store, runtime.local_bus)
        for trainer, rows in ((one, 2), (one, 2), (two, 1), (one, 1)):
            await _rewarded(client, rows)
            assert trainer.run_once() is not None
        latest = runtime.store.latest()
    (first, s1), (second, s2), (third, s3), (fourth, s4) = calls
    assert (s1, s2, s3, s4) == (6, 6, 3, 3)  # 3 steps per new row
    assert second is first
    assert first.state
    assert third is not second  # another trainer's process starts its own
    assert fourth is not third
    assert fourth is not second
    assert latest is not None
    record = json.loads(load_checkpoint(latest[1]).extra["config"])
    assert record["preset"] == PRODUCT.name
    assert record["rofu"] == json.loads(json.dumps(PRODUCT.rofu.__dict__))
    assert (record["fit_persist"], record["fit_steps_per_row"]) == (True, 3.0)


@pytest.mark.anyio
async def test_trainer_without_persist_starts_a_fresh_optimizer_every_run(
    sqlite_settings, monkeypatch
):
    optimizers: list[Any] = []
    real_fit = trainer_module.fit

    def recording(net, data, config, generator, **kwargs):
        optimizers.append(kwargs["optimizer"])
        return real_fit(net, data, config, generator, **kwargs)

    monkeypatch.setattr(trainer_module, "fit", recording)
    settings = sqlite_settings.model_copy(update={"fit_persist": False, "learners": ("mlp",)})
    async with app_client(settings) as (client, app):
        runtime = app.state.runtime
        trainer = Trainer(settings, runtime.sessions, runtime.store, runtime.local_bus)
        for _ in range(2):
            await _rewarded(client, 1)
            trainer.run_once()
    assert optimizers == [None, None]


@pytest.mark.anyio
async def test_trainer_with_a_training_window_keeps_the_last_rows_and_their_counts(
    sqlite_settings,
):
    settings = sqlite_settings.model_copy(update={"training_window": 5})
    async with app_client(settings) as (client, app):
        runtime = app.state.runtime
        trainer = Trainer(settings, runtime.sessions, runtime.store, runtime.local_bus)
        for rows in (3, 4):
            await _rewarded(client, rows)
            assert trainer.run_once() is not None
        latest = runtime.store.latest()
    assert latest is not None
    data = load_checkpoint(latest[1]).data
    # 7 rewarded rows, contexts starting 0.0, 0.1, 0.2, then 0.0 ... 0.3: the last 5 held
    assert (len(data.sample), data.n_total, int(data.arm_counts.sum())) == (5, 5, 5)
    firsts = sorted(round(float(x), 4) for x in data.sample.x[:, 0])
    assert firsts == [0.0, 0.1, 0.2, 0.2, 0.3]
