"""HTTP mode agrees with the in-process run: with the served model frozen, the service's
decisions equal an in-process ROFU on the same checkpoint, round for round."""

from __future__ import annotations

import numpy as np
import torch

from rofu.models import Scores, rofu_scores
from rofu.models.policies.base import greedy_decision
from rofu.models.rofu import ntk_basis
from rofu.replay.simulation.bandits import MLPBandit
from rofu.replay.simulation.http_driver import play
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
