"""HTTP mode agrees with the in-process run: with the served model frozen, the service's
decisions equal an in-process ROFU on the same checkpoint, round for round. And
`rofu replay --http` says what it measured: against a service with no trainer, that every
decision was the cold start (or it refuses to start); against the service its own
message suggests, the models that learned while it played, as the decision log has them."""

from __future__ import annotations

import json
import shlex
from collections import Counter

import numpy as np
import pytest
import torch

from rofu.client import RofuClient
from rofu.models import Scores, rofu_scores
from rofu.models.policies.base import greedy_decision
from rofu.models.rofu import ntk_basis
from rofu.replay.cli import main
from rofu.replay.simulation.bandits import MLPBandit, WheelBandit
from rofu.replay.simulation.http_driver import play, serve_command
from rofu.replay.simulation.simulate import WARM_START
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.deciding.scoring import checkpoint_generator
from rofu.service.deciding.snapshot import Snapshot
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.settings import ArmSpec, Settings
from tests.support import seed_checkpoint, service_process

ROUNDS, SEED = 60, 5


def _settings(database_url: str) -> Settings:
    bandit = MLPBandit()
    return Settings(
        database_url=database_url,
        context_dim=bandit.context_dim,
        arms=[ArmSpec(id=f"arm-{i}") for i in range(bandit.n_arms)],
        max_arms=bandit.n_arms,
        hidden=(16,),
        minibatch_size=64,
        embedded_trainer=False,
    )


def _in_process(settings: Settings, contexts: np.ndarray, n_arms: int) -> list[int]:
    """The service's scorer, replayed: same checkpoint, same generator, one request a batch."""
    engine = make_engine(settings.database_url)
    _, blob = CheckpointStore(session_factory(engine)).latest()
    engine.dispose()
    snapshot = Snapshot.from_blob(
        blob, settings.net_config(), torch.device("cpu"), hash_seed=settings.feature_hash_seed
    )
    generator = torch.Generator().manual_seed(settings.seed)
    config = settings.rofu_config()
    basis = None  # with ntk, the checkpoint's basis, as the service builds it
    if config.estimator == "ntk":
        basis = ntk_basis(
            snapshot.net,
            snapshot.data,
            config,
            checkpoint_generator(settings.seed, snapshot.version),
        )
    arms = []
    for t, context in enumerate(contexts):
        mask = torch.zeros(1, n_arms, dtype=torch.bool)
        if t < WARM_START * n_arms:
            mask[0, t % n_arms] = True  # the driver forces the round-robin arm
        else:
            mask[:] = True
        x = torch.tensor([[float(v) for v in context]], dtype=torch.float32)
        scores = rofu_scores(
            snapshot.net, x, snapshot.data, config, generator, candidates=mask, basis=basis
        )
        mean, bonus = scores.mean.double(), scores.bonus.double()
        arms.append(int(greedy_decision(Scores(mean, bonus), mask, generator).arms[0]))
    return arms


def test_http_mode_matches_the_in_process_run(tmp_path):
    settings = _settings(f"sqlite:///{tmp_path}/http.sqlite")
    seed_checkpoint(settings, n_rows=300)
    env = {
        "ROFU_DATABASE_URL": settings.database_url,
        "ROFU_CONTEXT_DIM": str(settings.context_dim),
        "ROFU_ARMS": "[" + ", ".join(f'{{"id": "{a.id}"}}' for a in settings.arms) + "]",
        "ROFU_MAX_ARMS": str(settings.max_arms),
        "ROFU_HIDDEN": "[16]",
        "ROFU_MINIBATCH_SIZE": "64",
        "ROFU_EMBEDDED_TRAINER": "false",
    }
    bandit = MLPBandit()
    stream = bandit.stream(ROUNDS, SEED)
    with service_process(env, tmp_path / "service.log") as base_url:
        run = play(base_url, bandit, stream, SEED)

    expected = _in_process(settings, stream.contexts, bandit.n_arms)
    assert list(run.result.arms) == expected
    rows = np.arange(ROUNDS)
    np.testing.assert_allclose(
        run.result.pseudo_regret, stream.means.max(1) - stream.means[rows, expected]
    )
    assert list(run.result.arms[: WARM_START * bandit.n_arms]) == [
        t % bandit.n_arms for t in range(WARM_START * bandit.n_arms)
    ]
    latency = run.percentiles()
    assert 0 < latency["select_p50_ms"] <= latency["select_p99_ms"]


def _suggested_env(database_url: str, **changes: str) -> dict[str, str]:
    """The environment of the `rofu serve` command the replay suggests for the wheel bandit,
    on `database_url`."""
    words = shlex.split(serve_command(WheelBandit()))
    env = dict(word.split("=", 1) for word in words if "=" in word)
    return env | {"ROFU_DATABASE_URL": database_url} | changes


def _replay(url: str, out, *extra: str, rounds: int) -> list[str]:
    return [
        *("--http", url, "--datasets", "wheel", "--seeds", "0", "--rounds", str(rounds)),
        *("--out", str(out), *extra),
    ]


def test_http_mode_without_a_trainer_refuses_or_reports_only_cold_starts(tmp_path, capsys):
    env = _suggested_env(f"sqlite:///{tmp_path}/none.sqlite", ROFU_EMBEDDED_TRAINER="false")
    warm = WARM_START * WheelBandit().n_arms
    with service_process(env, tmp_path / "service.log") as url:
        with pytest.raises(SystemExit) as exc:
            main(_replay(url, tmp_path / "refused", "--http-sync", "none", rounds=25))
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("rofu replay: error: the service serves no model yet")
        assert main(_replay(url, tmp_path / "waited", "--http-wait", "1.5", rounds=25)) == 1
        err = capsys.readouterr().err
        assert "trains in a separate `rofu trainer` process it cannot see" in err
        assert "no `rofu trainer` stored a checkpoint" in err.strip().splitlines()[-1]
        allowed = ("--http-sync", "none", "--http-allow-cold-start")
        assert main(_replay(url, tmp_path / "cold", *allowed, rounds=25)) == 0
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert line["cold_start_share"] == 1.0
    assert line["served_versions"] == {"0": 25 - warm}
    assert json.loads((tmp_path / "cold" / "http" / "results.json").read_text()) == [line]
    report = (tmp_path / "cold" / "http" / "README.md").read_text()
    assert f"| 1.00 of {25 - warm} | v0: {25 - warm} |" in report
    assert not (tmp_path / "refused" / "http").exists()


def test_http_mode_on_the_suggested_service_waits_for_its_models(tmp_path, capsys):
    env = _suggested_env(f"sqlite:///{tmp_path}/learns.sqlite")
    rounds = WARM_START * WheelBandit().n_arms + 60  # waits before 15 and 65 (every 50 rewards)
    with service_process(env, tmp_path / "service.log") as url:
        assert main(_replay(url, tmp_path, "--http-wait", "60", rounds=rounds)) == 0
        with RofuClient(url) as client:
            log = [d for d in client.export() if len(d.candidates) == WheelBandit().n_arms]
    out = capsys.readouterr()
    assert "2 waits of about 1-2 s" in out.err
    line = json.loads(out.out.splitlines()[0])
    assert (line["cold_start_share"], line["waits"]) == (0.0, 2)
    logged = Counter(str(d.model_version) for d in log)
    assert line["served_versions"] == dict(sorted(logged.items(), key=lambda kv: int(kv[0])))
    assert sum(line["served_versions"].values()) == len(log) == rounds - 15
    assert min(int(version) for version in line["served_versions"]) >= 1
