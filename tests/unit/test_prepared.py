"""One preparation of a checkpoint: the server, the replay and the benchmarks score alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rofu.bench.load_inprocess import seed_checkpoint, served_scorer
from rofu.models import RofuConfig, Scores, load_checkpoint
from rofu.models import rofu_stability as stability
from rofu.models.estimators import REGISTRY, get_estimator
from rofu.models.policies import RofuPolicy
from rofu.models.prepared import prepare, score
from rofu.models.rofu_config import CLOSED_FORMS, ESTIMATORS
from rofu.service.deciding.catalogue import Arm
from rofu.service.deciding.scoring import Scorer, SelectJob
from rofu.service.deciding.snapshot import Snapshot, SnapshotHolder
from rofu.service.settings import Settings
from tests.factories import make_data, make_net

N_ARMS, DIM = 3, 4


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The rho of every step resolution (`ascent_stiffness`) made while the test runs."""
    seen: list[float] = []
    original = stability.ascent_stiffness

    def counted(*args: object, **kwargs: object) -> float:
        rho = original(*args, **kwargs)  # type: ignore[arg-type]
        seen.append(rho)
        return rho

    monkeypatch.setattr(stability, "ascent_stiffness", counted)
    return seen


def _settings(tmp_path: Path, estimator: str) -> Settings:
    return Settings(
        database_url=f"sqlite:///{tmp_path / 'rofu.sqlite'}",
        context_dim=DIM,
        max_arms=N_ARMS,
        arms=[{"id": f"arm-{i}"} for i in range(N_ARMS)],  # type: ignore[list-item]
        hidden=(8,),
        device="cpu",
        estimator=estimator,  # type: ignore[arg-type]
        minibatch_size=None,  # every step on the whole sample: no draw tells the paths apart
        stability_cap=1e-3,  # small enough to cut the step
        seed=3,
    )


def _server_scores(settings: Settings, blob: bytes, contexts: torch.Tensor) -> list[torch.Tensor]:
    """The served (mean, bonus) of every context, one /select batch at a time."""
    snapshot = Snapshot.from_blob(blob, settings.net_config(), torch.device("cpu"), hash_seed=0)
    holder = SnapshotHolder()
    holder.swap(snapshot)
    catalogue = SimpleNamespace(current=SimpleNamespace(n_slots=N_ARMS))
    scorer = Scorer(holder, catalogue, settings.rofu_config(), 0, settings.seed)  # type: ignore[arg-type]
    arms = tuple(Arm(f"arm-{i}", i, None, True) for i in range(N_ARMS))
    rows = []
    for batch in (contexts[:2], contexts[2:]):  # two calls: the preparation is kept
        jobs = [SelectJob(f"e{i}", tuple(x.tolist()), arms, True) for i, x in enumerate(batch)]
        for outcome in scorer(jobs):
            assert outcome is not None
            rows.append(torch.tensor([[s.mean, s.bonus] for s in outcome.scores]))
    return rows


def _replay_scores(settings: Settings, blob: bytes, contexts: torch.Tensor) -> Scores:
    """The replay's RofuPolicy on the checkpoint's weights and rows."""
    checkpoint = load_checkpoint(blob)
    policy = RofuPolicy(settings.net_config(), params=settings.rofu_config(), seed=settings.seed)
    policy.net.load_state_dict(checkpoint.state)
    policy.buffer.append(checkpoint.data.sample)
    first, second = policy.scores(contexts[:2]), policy.scores(contexts[2:])
    return Scores(torch.cat([first.mean, second.mean]), torch.cat([first.bonus, second.bonus]))


@pytest.mark.parametrize("estimator", [e for e in ESTIMATORS if e not in CLOSED_FORMS])
def test_prepared_server_replay_and_load_bench_score_a_checkpoint_alike(
    tmp_path: Path, resolutions: list[float], estimator: str
) -> None:
    seen = resolutions
    settings = _settings(tmp_path, estimator)
    _, blob = seed_checkpoint(settings, n_data=64, seed=1)
    contexts = torch.randn(5, DIM, generator=torch.Generator().manual_seed(7))

    served = torch.stack(_server_scores(settings, blob, contexts))  # (B, A, 2)
    assert len(seen) == 1, "the server resolves the step once per checkpoint"
    replayed = _replay_scores(settings, blob, contexts)
    assert len(seen) == 2, "the replay resolves it once per refit"
    bench = served_scorer(settings, blob)
    timed = torch.cat([bench(contexts[:2]).ucb, bench(contexts[2:]).ucb])
    benched = torch.cat([bench(contexts[:2]).bonus, bench(contexts[2:]).bonus])
    assert len(seen) == 3, "the load benchmark resolves it once, not at every call"

    assert seen[0] > 1e-3, "the cap must cut the step for the test to mean anything"
    assert torch.equal(served[..., 0].float(), replayed.mean)
    assert torch.equal(served[..., 1].float(), replayed.bonus)
    assert torch.equal(timed, replayed.ucb)
    assert torch.equal(benched, replayed.bonus)
    assert bool((replayed.bonus > 0).all())


def test_prepared_score_equals_rofu_scores_with_the_resolved_step() -> None:
    net, data = make_net(hidden=(16,)), make_data(120, 6, 4)
    config = RofuConfig(step_size=0.5, minibatch_size=32, stability_cap=0.3)
    contexts = torch.randn(3, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    prepared = prepare(net, data, config, torch.Generator().manual_seed(0))
    assert prepared.config.stability_cap is None
    assert prepared.config.step_size < config.step_size
    once = score(prepared, contexts, torch.Generator().manual_seed(1))
    loose = dataclasses.replace(config, stability_cap=None)
    uncapped = prepare(net, data, loose, torch.Generator())
    plain = score(uncapped, contexts, torch.Generator().manual_seed(1))
    assert not torch.equal(once.bonus, plain.bonus)


def test_prepared_ntk_and_closed_forms_hold_a_basis_and_exact_none() -> None:
    net, data = make_net(hidden=(8,)), make_data(40, 6, 4)
    for name in ESTIMATORS:
        config = RofuConfig(estimator=name, minibatch_size=8, l2=0.5)
        prepared = prepare(net, data, config, torch.Generator().manual_seed(0))
        assert (prepared.basis is not None) == (name != "exact")
        assert prepared.graphs is None  # no CUDA graphs off a GPU


def test_estimator_registry_is_the_configs_vocabulary() -> None:
    assert tuple(REGISTRY) == ESTIMATORS
    assert get_estimator("ntk").name == "ntk"
    with pytest.raises(
        ValueError, match=f"estimator must be one of {', '.join(ESTIMATORS)}, got 'fast'"
    ):
        get_estimator("fast")
    with pytest.raises(ValueError, match="estimator"):
        RofuConfig(estimator="fast")
