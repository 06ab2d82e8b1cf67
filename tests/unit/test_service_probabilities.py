"""/select's exact probabilities on SQLite: every candidate's probability in the response
and the row, scores that depend only on (version, candidates, context), and choice
frequencies that match the stated probabilities (chi-square at a fixed seed)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import Counter
from typing import Any

import httpx
import pytest
from scipy.stats import chisquare

from rofu.models.rofu import checkpoint_config
from rofu.service.db import repository
from rofu.service.deciding.scoring import Scorer, SelectJob, event_uniform
from rofu.service.runtime import Runtime
from rofu.service.settings import Settings
from tests.support import app_client, seed_checkpoint

CONTEXT = [0.5, -0.25, 1.0, 0.0]
OTHERS = [[0.1, 0.2, -0.3, 0.4], [-1.0, 0.5, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0]]


def _seeded(settings: Settings, **update: Any) -> Settings:
    """`settings` with `update`, and two stored checkpoints (versions 1 and 2)."""
    settings = settings.model_copy(update=update)
    seed_checkpoint(settings, version=1, seed=0)
    seed_checkpoint(settings, version=2, seed=1)
    return settings


async def _select(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    body.setdefault("context", CONTEXT)
    response = await client.post("/v1/select", json=body)
    assert response.status_code == 200, response.text
    decision: dict[str, Any] = response.json()
    return decision


def _probabilities(decision: dict[str, Any]) -> dict[str, float]:
    return {p["arm"]: p["probability"] for p in decision["probabilities"]}


@pytest.mark.anyio
async def test_service_select_returns_and_stores_every_candidates_probability(
    sqlite_settings: Settings,
) -> None:
    settings = _seeded(sqlite_settings, exploration_floor=0.2)
    async with app_client(settings) as (client, app):
        decision = await _select(client, arms=["arm-3", "arm-0", "arm-2"])
        runtime: Runtime = app.state.runtime
        row = repository.find_decision(runtime.sessions, decision["event_id"])
    arms = [p["arm"] for p in decision["probabilities"]]
    assert arms == [s["arm"] for s in decision["scores"]] == ["arm-3", "arm-0", "arm-2"]
    probabilities = _probabilities(decision)
    assert math.isclose(sum(probabilities.values()), 1.0)
    assert min(probabilities.values()) >= 0.2 / 3 - 1e-12  # the floor: eps / K
    assert probabilities[decision["arm"]] == decision["propensity"]
    assert row is not None
    assert row.probabilities == [probabilities[arm] for arm in row.candidates]
    assert row.propensity == decision["propensity"]


@pytest.mark.anyio
async def test_service_select_cold_start_and_exploit_probabilities(
    sqlite_settings: Settings,
) -> None:
    settings = sqlite_settings.model_copy(update={"exploration_floor": 0.5})
    async with app_client(settings) as (client, _):
        cold = await _select(client)
    assert set(_probabilities(cold).values()) == {0.25}
    settings = _seeded(sqlite_settings, exploration_floor=0.5)
    async with app_client(settings) as (client, _):
        exploit = await _select(client, explore=False)
    assert exploit["propensity"] == 1.0  # no floor where the request asked not to explore
    assert sorted(_probabilities(exploit).values()) == [0.0, 0.0, 0.0, 1.0]


@pytest.mark.anyio
@pytest.mark.parametrize("estimator", ["ntk", "exact"])
async def test_service_scores_do_not_depend_on_batch_mates_or_repeats(
    sqlite_settings: Settings, estimator: str
) -> None:
    """The minibatches come from the checkpoint, drawn afresh per call and shared by every
    pair of the call: a request scores the same alone, among others, and again."""
    settings = _seeded(sqlite_settings, estimator=estimator, minibatch_size=32)
    async with app_client(settings) as (_, app):
        runtime: Runtime = app.state.runtime
        scorer = Scorer(runtime.holder, runtime.catalogue, settings.rofu_config(), 0, 0)
        arms = tuple(runtime.catalogue.fresh().candidates(None, None))

        def job(context: list[float], event_id: str = "e") -> SelectJob:
            return SelectJob(event_id, tuple(context), arms, True)

        alone = scorer([job(CONTEXT)])[0]
        among = scorer([job(OTHERS[0], "a"), job(CONTEXT), job(OTHERS[1], "b")])[1]
        bigger = scorer([job(c, f"x{i}") for i, c in enumerate(OTHERS * 30)] + [job(CONTEXT)])
        again = scorer([job(CONTEXT)])[0]
        served_on = runtime.device.type  # CUDA where present
    assert alone is not None
    assert among is not None
    assert again is not None
    assert bigger[-1] is not None
    assert alone.model_version == 2
    for other in (among, bigger[-1], again):
        if served_on == "cuda" and estimator == "exact":
            # On a GPU the exact estimator replays one CUDA graph per batch bucket, and
            # cuBLAS picks its kernels by shape: batch mates can move the last float32 bits.
            assert [s.arm for s in other.scores] == [s.arm for s in alone.scores]
            for got, want in zip(other.scores, alone.scores, strict=True):
                assert (got.mean, got.bonus) == pytest.approx((want.mean, want.bonus), rel=1e-4)
            assert other.probabilities == pytest.approx(alone.probabilities, abs=1e-6)
        else:
            assert other.scores == alone.scores
            assert other.probabilities == alone.probabilities
        assert other.arm == alone.arm
    assert all(s.bonus is not None and s.bonus > 0 for s in alone.scores)


def test_service_event_uniform_is_a_fixed_number_in_the_unit_interval() -> None:
    draws = [event_uniform(0, f"e-{i}") for i in range(2000)]
    assert all(0.0 <= u < 1.0 for u in draws)
    assert event_uniform(0, "e-1") == draws[1]
    assert event_uniform(1, "e-1") != draws[1]
    assert abs(sum(draws) / len(draws) - 0.5) < 0.02


RULES = [
    ("argmax, floor 0.3", {"exploration_floor": 0.3}),
    ("igw, floor 0.1", {"selection": "igw", "igw_gamma": 2.0, "exploration_floor": 0.1}),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("name", "rule"), RULES, ids=[r[0] for r in RULES])
async def test_service_choice_frequencies_match_the_probabilities_on_a_pinned_version(
    sqlite_settings: Settings, name: str, rule: dict[str, Any]
) -> None:
    """N identical requests (distinct event ids, sent concurrently so they batch) on a
    pinned version: one set of probabilities, and the arms follow it (chi-square)."""
    n = 600
    settings = _seeded(sqlite_settings, **rule)
    async with app_client(settings) as (client, _):
        pinned = await client.put("/v1/admin/pin", json={"version": 1})
        assert pinned.json() == {"pinned": 1, "serving": 1}
        decisions: list[dict[str, Any]] = []
        for start in range(0, n, 50):
            calls = [_select(client, event_id=f"chi-{i}") for i in range(start, start + 50)]
            decisions += await asyncio.gather(*calls)
    assert {d["model_version"] for d in decisions} == {1}
    stated = _probabilities(decisions[0])
    assert all(_probabilities(d) == stated for d in decisions)
    assert sum(p > 0.05 for p in stated.values()) >= 2, stated  # several arms have mass
    counts = Counter(d["arm"] for d in decisions)
    arms = sorted(stated)
    observed = [counts[arm] for arm in arms]
    expected = [stated[arm] * n for arm in arms]
    result = chisquare(observed, expected)
    assert result.pvalue > 0.01, (name, observed, expected)


@pytest.mark.anyio
@pytest.mark.parametrize("estimator", ["ntk", "exact"])
async def test_service_scores_with_a_stability_cap_run_the_checkpoints_resolved_step(
    sqlite_settings: Settings, estimator: str
) -> None:
    """With ROFU_STABILITY_CAP the scorer resolves the step once per checkpoint, as
    `checkpoint_config` (and so `rofu evaluate` and the replay) does, and scores with it."""
    settings = _seeded(sqlite_settings, estimator=estimator, minibatch_size=32, stability_cap=1e-3)
    config = settings.rofu_config()
    async with app_client(settings) as (_, app):
        runtime: Runtime = app.state.runtime
        snapshot = runtime.holder.current
        assert snapshot is not None
        capped = Scorer(runtime.holder, runtime.catalogue, config, 0, 0)
        uncapped = dataclasses.replace(config, stability_cap=None)
        plain = Scorer(runtime.holder, runtime.catalogue, uncapped, 0, 0)
        arms = tuple(runtime.catalogue.fresh().candidates(None, None))
        job = SelectJob("e", tuple(CONTEXT), arms, True)
        low, high = capped([job])[0], plain([job])[0]
        resolved = capped.prepared(snapshot, None).config
    assert resolved == checkpoint_config(snapshot.net, snapshot.data, config)
    assert resolved.stability_cap is None
    assert resolved.step_size < config.step_size
    assert low is not None
    assert high is not None
    for small, large in zip(low.scores, high.scores, strict=True):
        assert small.bonus is not None
        assert large.bonus is not None
        assert 0 < small.bonus < large.bonus
