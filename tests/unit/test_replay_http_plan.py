"""`rofu replay --http` before and during its runs: the preflight's reading of the service's
settings (GET /v1/model), its refusals, the waits for the service to learn, and the
cold-start share and model versions a run reports. Played against a scripted service
through httpx's mock transport; tests/e2e/test_replay_http.py plays real servers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import rofu.replay.http_run as http_run
import rofu.replay.simulation.http_driver as http_driver
from rofu.client import ModelResponse, RofuClient
from rofu.client.schemas import TrainingInfo
from rofu.replay.cli import main
from rofu.replay.simulation.bandits import WheelBandit
from rofu.replay.simulation.http_plan import Meaningless, Sync, pace_line, plan
from rofu.replay.simulation.simulate import WARM_START
from rofu.service.settings import Settings
from tests.support import app_client

WARM = WARM_START * WheelBandit().n_arms  # 15


def _training(**changes: Any) -> TrainingInfo:
    values: dict[str, Any] = {
        "trainer": "embedded",
        "reward_window_seconds": 1.0,
        "train_every_rewards": 10,
        "train_interval_seconds": 1.0,
        "checkpoint_poll_seconds": 5.0,
    }
    return TrainingInfo(**(values | changes))


def _model(
    version: int = 0, n_data: int = 0, training: TrainingInfo | None = None
) -> ModelResponse:
    return ModelResponse(
        version=version,
        checksum=None,
        created_at=None,
        age_seconds=None,
        n_data=n_data,
        network={"context_dim": 2},
        rofu={},
        feature_hash_seed=0,
        training=training,
    )


class ScriptedService:
    """A service shaped for the wheel bandit whose trainer, where it has one, has learned
    every reward by the next GET /v1/model (a new version each time there is news)."""

    def __init__(self, trains: bool = True, trainer: str = "embedded", window: float = 1.0):
        self.trains = trains
        self.training = _training(trainer=trainer, reward_window_seconds=window)
        self.version = self.learned = self.rewards = 0
        self.requests: list[str] = []
        self.keys: set[str | None] = set()

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        self.keys.add(request.headers.get("authorization"))
        route = {
            "/v1/model": self._model,
            "/v1/arms": self._arms,
            "/v1/select": self._select,
            "/v1/reward": self._reward,
        }[request.url.path]
        body = json.loads(request.content) if request.content else None
        return httpx.Response(200, json=route(body))

    def _model(self, _: object) -> dict[str, Any]:
        if self.trains and self.rewards > self.learned:
            self.version, self.learned = self.version + 1, self.rewards
        return _model(self.version, self.learned, self.training).model_dump()

    def _arms(self, _: object) -> list[dict[str, Any]]:
        return [{"id": f"arm-{i}", "slot": i, "features": None, "active": True} for i in range(5)]

    def _select(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "event_id": body["event_id"],
            "arm": (body.get("arms") or ["arm-0"])[0],
            "model_version": self.version,
            "propensity": 1.0,
            "explore": True,
            "policy": "cold-start" if self.version == 0 else "rofu",
            "scores": [],
        }

    def _reward(self, body: dict[str, Any]) -> dict[str, Any]:
        self.rewards += 1
        return {"event_id": body["event_id"], "value": body["value"], "duplicate": False}


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch):
    """Point the replay's clients at a ScriptedService; returns a function that installs one."""

    def install(service: ScriptedService) -> ScriptedService:
        def client(url: str, **kwargs: Any) -> RofuClient:
            return RofuClient(url, transport=httpx.MockTransport(service.handle), **kwargs)

        monkeypatch.setattr(http_run, "RofuClient", client)
        monkeypatch.setattr(http_driver, "RofuClient", client)
        return service

    return install


def _argv(out: Path, *extra: str, rounds: int = 45) -> list[str]:
    url = "http://rofu.test"
    return ["--http", url, "--datasets", "wheel", "--seeds", "0", "--rounds", str(rounds)] + [
        "--out",
        str(out),
        *extra,
    ]


# The preflight, on what GET /v1/model says ------------------------------------------------


def test_plan_every_waits_after_the_warm_start_then_every_training_run():
    checked = plan(_model(training=_training()), rounds=45, warm=WARM, mode="every", wait_s=30)
    assert checked.sync.every == 10
    assert checked.sync.waits_at(45, WARM, version=0) == (15, 25, 35)
    text = "\n".join(checked.lines)
    assert "serves model 0 (learned from 0 rows)" in text
    assert "1 s reward window, after 10 new rewards or every 1 s" in text
    assert "3 waits of about 1-2 s" in text
    assert all("\n" not in line for line in checked.lines)


def test_plan_first_waits_for_model_one_only_where_none_serves():
    fresh = plan(_model(training=_training()), 45, WARM, "first", 30)
    assert fresh.sync.waits_at(45, WARM, version=0) == (15,)
    warm_service = plan(_model(3, 400, _training()), 45, WARM, "first", 30)
    assert warm_service.sync.waits_at(45, WARM, version=3) == ()
    assert any("model 3 serves already" in line for line in warm_service.lines)


def test_plan_refuses_no_model_and_no_waiting_in_one_line_unless_allowed():
    external = _model(training=_training(trainer="external", reward_window_seconds=60))
    with pytest.raises(Meaningless) as refused:
        plan(external, 45, WARM, "none", 30)
    message = str(refused.value)
    assert "\n" not in message
    assert "serves no model yet and --http-sync none never waits" in message
    assert "60 s after the first round at the earliest" in message
    assert "--http-allow-cold-start" in message
    allowed = plan(external, 45, WARM, "none", 30, allow_cold_start=True)
    assert allowed.sync.waits_at(45, WARM, 0) == ()
    text = "\n".join(allowed.lines)
    assert "a separate `rofu trainer` process it cannot see" in text
    assert "if none runs, no model will come" in text
    assert "--http-allow-cold-start: the run goes ahead, though the service serves no model" in text


def test_plan_refuses_a_wait_shorter_than_the_reward_window():
    long_window = _model(training=_training(reward_window_seconds=60))
    with pytest.raises(Meaningless, match="--http-wait 5 s is shorter than the service's 60 s"):
        plan(long_window, 45, WARM, "every", wait_s=5)
    checked = plan(long_window, 45, WARM, "every", wait_s=60.5)
    assert "--http-wait 60.5 s may end a wait before its model comes (up to 61 s)" in checked.lines


def test_plan_of_a_service_that_does_not_say_when_it_trains_waits_for_model_one_only():
    checked = plan(_model(), 45, WARM, "every", 30)
    assert checked.sync.waits_at(45, WARM, version=0) == (15,)
    assert any("does not say when it trains" in line for line in checked.lines)


def test_pace_line_says_when_the_rest_of_the_run_is_shorter_than_the_window():
    quick = pace_line(_training(reward_window_seconds=60), played=30, seconds=1.0, left=470)
    assert quick is not None
    assert "30 a second, the other 470 take about 16 s, less than the service's 60 s" in quick
    slow = pace_line(_training(reward_window_seconds=1), played=30, seconds=1.0, left=470)
    assert slow is not None
    assert "a model learns a round 1 s (30 rounds) after" in slow
    assert pace_line(None, 30, 1.0, 470) is None


@pytest.mark.anyio
async def test_model_endpoint_says_when_the_service_trains(sqlite_settings: Settings):
    embedded = sqlite_settings.model_copy(
        update={"embedded_trainer": True, "reward_window_seconds": 5.0, "train_every_rewards": 7}
    )
    for settings, trainer in ((sqlite_settings, "external"), (embedded, "embedded")):
        async with app_client(settings) as (client, _):
            training = (await client.get("/v1/model")).json()["training"]
        assert training == {
            "trainer": trainer,
            "reward_window_seconds": settings.reward_window_seconds,
            "train_every_rewards": settings.train_every_rewards,
            "train_interval_seconds": settings.train_interval_seconds,
            "checkpoint_poll_seconds": settings.checkpoint_poll_seconds,
        }


# Runs against the scripted service ------------------------------------------------------


def test_replay_http_every_reports_the_models_that_decided(scripted, tmp_path, capsys):
    service = scripted(ScriptedService())
    assert main(_argv(tmp_path, "--http-wait", "5")) == 0
    out = capsys.readouterr()
    line = json.loads(out.out.splitlines()[0])
    # waits before rounds 15, 25 and 35: each serves a model that learned every round played
    assert line["served_versions"] == {"1": 10, "2": 10, "3": 10}
    assert (line["cold_start_share"], line["decided_rounds"], line["waits"]) == (0.0, 30, 3)
    assert "3 waits of about 1-2 s" in out.err
    figures = json.loads((tmp_path / "http" / "results.json").read_text())
    assert figures == [line]
    report = (tmp_path / "http" / "README.md").read_text()
    assert "| wheel | 0 |" in report
    assert "| 0.00 of 30 | v1: 10, v2: 10, v3: 10 | 3 (" in report
    assert "- wheel, seed 0: v1: 10, v2: 10, v3: 10" in report
    assert service.rewards == 45


def test_replay_http_with_no_model_fails_the_wait_and_says_why(scripted, tmp_path, capsys):
    service = scripted(ScriptedService(trains=False, trainer="external"))
    assert main(_argv(tmp_path, "--http-sync", "first", "--http-wait", "1")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rofu replay: error: no model learned from the 15 rounds played")
    assert "no `rofu trainer` stored a checkpoint" in err[-1]
    assert "pass --http-allow-cold-start" in err[-1]
    assert service.rewards == WARM  # it stopped at the wait


def test_replay_http_allowed_cold_start_reports_a_share_of_one(scripted, tmp_path, capsys):
    scripted(ScriptedService(trains=False, trainer="external"))
    argv = _argv(tmp_path, "--http-sync", "first", "--http-wait", "1", "--http-allow-cold-start")
    assert main(argv) == 0
    out = capsys.readouterr()
    line = json.loads(out.out.splitlines()[0])
    assert (line["cold_start_share"], line["served_versions"]) == (1.0, {"0": 30})
    assert "the replay plays on without waiting" in out.err
    report = (tmp_path / "http" / "README.md").read_text()
    assert "| 1.00 of 30 | v0: 30 |" in report
    assert "every decided round was the cold start: it measures no model" in report
    assert "the replay plays on without waiting" in report


def test_replay_http_refusal_is_one_line_exit_2_and_sends_nothing(scripted, tmp_path, capsys):
    service = scripted(ScriptedService(trains=False, trainer="external", window=60))
    for extra, message in (
        (("--http-sync", "none"), "--http-sync none never waits for one"),
        (("--http-wait", "5"), "--http-wait 5 s is shorter than the service's 60 s reward"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(_argv(tmp_path, *extra))
        assert exc.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("rofu replay: error: ")
        assert message in last
    assert {request.split()[0] for request in service.requests} == {"GET"}
    assert not (tmp_path / "http").exists()


def test_replay_http_options_only_with_http(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--datasets", "wheel", "--http-sync", "none", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "--http-sync: only with --http" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(_argv(tmp_path, "--http-wait", "0"))
    assert "expected a positive number of seconds" in capsys.readouterr().err


def test_sync_none_never_waits():
    assert Sync().waits_at(100, 15, version=0) == ()


def test_replay_http_sends_the_key_in_rofu_api_key(scripted, tmp_path, monkeypatch, capsys):
    service = scripted(ScriptedService())
    monkeypatch.setenv("ROFU_API_KEY", "client-key")
    assert main(_argv(tmp_path, "--http-wait", "5")) == 0
    assert service.keys == {"Bearer client-key"}  # the preflight's requests and the run's
    monkeypatch.delenv("ROFU_API_KEY")
    keyless = scripted(ScriptedService())
    assert main(_argv(tmp_path / "again", "--http-wait", "5")) == 0
    assert keyless.keys == {None}
