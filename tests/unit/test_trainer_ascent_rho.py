"""The trainer measures ROFU's ascent stability at every checkpoint it publishes: rho is
stored in the checkpoint's metrics, exported as `rofu_trainer_ascent_rho`, and past 2,
with no stability cap, a warning names the setting that fixes it."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from rofu.models import load_checkpoint
from rofu.models.rofu import ascent_rho
from rofu.service.lifecycle.trainer import Trainer
from tests.support import app_client
from tests.trainers import log_decisions


def _trainer(runtime) -> Trainer:
    return Trainer(
        runtime.settings, runtime.sessions, runtime.store, runtime.local_bus, runtime.metrics
    )


def _checkpoint_rho(runtime, settings) -> tuple[float, float]:
    """(the stored metric, rho recomputed from the stored checkpoint)."""
    row, blob = runtime.store.latest()
    checkpoint = load_checkpoint(blob)
    net = checkpoint.network()
    config = dataclasses.replace(settings.rofu_config(), stability_cap=None)
    recomputed = ascent_rho(net, checkpoint.data, config, arm_features=checkpoint.arm_features)
    return row.metrics["ascent_rho"], recomputed


@pytest.mark.anyio
async def test_every_checkpoint_carries_its_ascent_rho_and_the_gauge_follows(
    sqlite_settings, caplog
):
    async with app_client(sqlite_settings) as (_, app):
        runtime = app.state.runtime
        log_decisions(runtime.sessions, "a", 12)
        with caplog.at_level(logging.WARNING, logger="rofu.trainer"):
            report = _trainer(runtime).run_once()
        stored, recomputed = _checkpoint_rho(runtime, sqlite_settings)
        gauge = runtime.metrics.trainer_ascent_rho._value.get()
    assert report is not None
    assert stored == pytest.approx(recomputed, rel=1e-9)
    assert report.ascent_rho == stored == gauge
    assert 0 < stored < 2  # the demo's default step is stable here
    assert "rho" not in caplog.text


@pytest.mark.anyio
@pytest.mark.parametrize("cap", [None, 1.0])
async def test_an_unstable_step_is_warned_about_unless_capped(sqlite_settings, caplog, cap):
    settings = sqlite_settings.model_copy(update={"step_size": 1e4, "stability_cap": cap})
    async with app_client(settings) as (_, app):
        runtime = app.state.runtime
        log_decisions(runtime.sessions, "a", 12)
        with caplog.at_level(logging.WARNING, logger="rofu.trainer"):
            report = _trainer(runtime).run_once()
    assert report is not None
    assert report.ascent_rho is not None
    assert report.ascent_rho > 2  # measured at ROFU_STEP_SIZE, whatever the cap
    warned = "ROFU_STABILITY_CAP=1" in caplog.text
    assert warned is (cap is None)
