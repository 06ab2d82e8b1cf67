"""Arm features that vary by row: per-request features of the scored pairs
(`rofu_scores(pair_features=...)`) and per-row features of the data (`Transitions.features`).

Every estimator must score a pair with per-request features exactly as it scores the same
pair from a catalogue whose row holds those features, and must read a data row's own
features exactly as if a table held them at the row's index.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rofu.models import (
    Checkpoint,
    DataBuffer,
    RegulariserData,
    RofuConfig,
    Transitions,
    dump_checkpoint,
    fit,
    load_checkpoint,
    rofu_scores,
)
from rofu.models.checkpoint import CheckpointError
from rofu.models.rofu import ntk_basis
from rofu.models.rofu_graphs import GraphedExact
from rofu.models.training import FitConfig
from tests.factories import arm_features, make_data, make_net

A, F, D = 4, 3, 5
ESTIMATORS = [
    ("exact, fast kernel", {"estimator": "exact"}, "fast"),
    ("exact, torch.func", {"estimator": "exact"}, "functional"),
    ("ntk", {"estimator": "ntk"}, "fast"),
]
CONFIG = RofuConfig(
    step_size=0.1, steps=3, eta=0.01, minibatch_size=16, regulariser="arm_count", l2=0.1
)


def _scores(net, contexts, data, config, table, kernel, **kwargs):
    return rofu_scores(
        net,
        contexts,
        data,
        config,
        torch.Generator().manual_seed(3),
        arm_features=table,
        kernel=kernel,
        **kwargs,
    )


@pytest.mark.parametrize(("name", "options", "kernel"), ESTIMATORS, ids=[e[0] for e in ESTIMATORS])
def test_rofu_scores_with_pair_features_equal_a_catalogue_holding_them(name, options, kernel):
    net = make_net(D, arm_feature_dim=F)
    data, table = make_data(40, D, A, seed=1), arm_features(A, F)
    config = dataclasses.replace(CONFIG, **options)
    contexts = torch.randn(2, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    own = torch.tensor([0.7, -1.2, 2.0], dtype=torch.float64)
    pair = table.expand(2, A, F).clone()
    pair[0, 1] = own  # request 0 scores arm 1 with its own features; request 1 does not
    got = _scores(net, contexts, data, config, table, kernel, pair_features=pair)
    replaced = table.clone()
    replaced[1] = own
    # The regulariser's rows keep the catalogue's features: here they carry them.
    kept = dataclasses.replace(data, sample=data.sample.with_features(table))
    first = _scores(net, contexts[:1], kept, config, replaced, kernel)
    second = _scores(net, contexts[1:], data, config, table, kernel)
    torch.testing.assert_close(got.mean, torch.cat([first.mean, second.mean]))
    torch.testing.assert_close(got.bonus, torch.cat([first.bonus, second.bonus]))
    assert float(got.bonus[0, 1]) > 0  # the ascent moved: bonuses compared, not zeros
    assert not torch.allclose(got.mean[0, 1], second.mean[0, 1])  # the features mattered
    assert not torch.allclose(got.bonus[0, 1], second.bonus[0, 1])


def test_rofu_scores_pair_features_keep_the_prepared_ntk_basis_valid():
    net = make_net(D, arm_feature_dim=F)
    data, table = make_data(40, D, A, seed=1), arm_features(A, F)
    config = dataclasses.replace(CONFIG, estimator="ntk")
    basis = ntk_basis(net, data, config, torch.Generator().manual_seed(3), arm_features=table)
    contexts = torch.randn(3, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pair = table.expand(3, A, F).clone()
    pair[2, 0] = torch.tensor([1.0, 0.0, -1.0])
    with_basis = _scores(
        net, contexts, data, config, table, "fast", pair_features=pair, basis=basis
    )
    without = _scores(net, contexts, data, config, table, "fast", pair_features=pair)
    torch.testing.assert_close(with_basis.ucb, without.ucb)


def test_rofu_scores_refuse_bad_pair_features():
    data, table = make_data(20, D, A), arm_features(A, F)
    contexts = torch.zeros(2, D, dtype=torch.float64)
    with pytest.raises(ValueError, match="pair_features must have 2 entries in dim 0"):
        _scores(
            make_net(D, arm_feature_dim=F),
            contexts,
            data,
            CONFIG,
            table,
            "fast",
            pair_features=table.expand(3, A, F),
        )
    with pytest.raises(ValueError, match="pair_features must be None"):
        _scores(
            make_net(D, A), contexts, data, CONFIG, None, "fast", pair_features=torch.zeros(2, A, F)
        )


def _own_rows(data: RegulariserData, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(len(data.sample), F, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize(("name", "options", "kernel"), ESTIMATORS, ids=[e[0] for e in ESTIMATORS])
def test_rofu_scores_read_each_data_rows_own_features(name, options, kernel):
    net = make_net(D, arm_feature_dim=F)
    data, table = make_data(40, D, A, seed=1), arm_features(A, F)
    config = dataclasses.replace(CONFIG, regulariser="dataset", **options)
    contexts = torch.randn(3, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    sample = data.sample
    # Rows carrying their catalogue features: the same scores as rows reading the table.
    same = dataclasses.replace(data, sample=sample.with_features(table))
    plain = _scores(net, contexts, data, config, table, kernel)
    torch.testing.assert_close(_scores(net, contexts, same, config, table, kernel).ucb, plain.ucb)
    # Rows carrying features of their own: as if a longer table held one row per data row
    # (the `dataset` regulariser reads no per-arm counts, so the arm indices may move).
    own = _own_rows(data, seed=5)
    carried = dataclasses.replace(
        data, sample=Transitions(sample.x, sample.arms, sample.rewards, own)
    )
    longer = torch.cat([table, own])
    moved = Transitions(sample.x, A + torch.arange(len(sample)), sample.rewards)
    reference = _scores(
        net,
        contexts,
        RegulariserData(moved, data.n_total, torch.tensor([0] * A + [1] * len(sample))),
        config,
        longer,
        kernel,
        candidates=torch.arange(A + len(sample)).expand(3, -1) < A,
    )
    got = _scores(net, contexts, carried, config, table, kernel)
    torch.testing.assert_close(got.ucb, reference.ucb[:, :A])
    assert int((got.bonus > 0).sum()) > 6  # bonuses compared, not zeros
    assert not torch.allclose(got.bonus, plain.bonus)  # the rows' features mattered


def test_fit_trains_on_each_rows_own_features():
    data, table = make_data(30, D, A, seed=2), arm_features(A, F)
    config = FitConfig(steps=20, batch_size=8)

    def trained(rows: Transitions, features: torch.Tensor | None) -> list[torch.Tensor]:
        net = make_net(D, arm_feature_dim=F)
        fit(net, rows, config, torch.Generator().manual_seed(1), arm_features=features)
        return [p.detach().clone() for p in net.parameters()]

    plain = trained(data.sample, table)
    for got, want in zip(trained(data.sample.with_features(table), table), plain, strict=True):
        torch.testing.assert_close(got, want)
    own = _own_rows(data, seed=6)
    sample = data.sample
    carried = trained(Transitions(sample.x, sample.arms, sample.rewards, own), table)
    moved = Transitions(sample.x, torch.arange(len(sample)), sample.rewards)
    for got, want in zip(carried, trained(moved, own), strict=True):
        torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="data.features must have 0 columns"):
        fit(make_net(D, A), Transitions(sample.x, sample.arms, sample.rewards, own), config, None)


def test_data_buffer_keeps_each_rows_features_through_the_reservoir_and_a_restore():
    gen = torch.Generator().manual_seed(0)
    buffer = DataBuffer(2, max_size=5, generator=gen, arm_feature_dim=F)
    rows = 12
    x = torch.arange(rows * 2, dtype=torch.float32).view(rows, 2)
    features = x[:, :1].expand(rows, F) * 10  # row n's features: 20 n, tied to its x
    buffer.append(Transitions(x, torch.arange(rows) % A, torch.zeros(rows), features))
    held = buffer.view()
    assert held.features is not None
    assert len(held) == 5
    torch.testing.assert_close(held.features, held.x[:, :1].expand(5, F) * 10)
    restored = DataBuffer.restore(buffer.regulariser_data(A), max_size=5)
    assert restored.arm_feature_dim == F
    torch.testing.assert_close(restored.view().features, held.features)
    with pytest.raises(ValueError, match="batch.features must have 3 columns"):
        buffer.append(Transitions(x, torch.arange(rows) % A, torch.zeros(rows)))


def test_checkpoint_round_trips_the_rows_own_features():
    net = make_net(D, arm_feature_dim=F).float()
    data = make_data(10, D, A, dtype=torch.float32)
    own = torch.randn(10, F, generator=torch.Generator().manual_seed(4))
    sample = Transitions(data.sample.x, data.sample.arms, data.sample.rewards, own)
    checkpoint = Checkpoint(
        version=1,
        net_config=net.config,
        state=net.state_dict(),
        data=RegulariserData(sample, data.n_total, data.arm_counts),
        arm_features=arm_features(A, F).float(),
    )
    loaded = load_checkpoint(dump_checkpoint(checkpoint))
    assert loaded.data.sample.features is not None
    torch.testing.assert_close(loaded.data.sample.features, own)
    per_arm = make_net(D, A).float()
    bad = dataclasses.replace(checkpoint, net_config=per_arm.config, state=per_arm.state_dict())
    bad = dataclasses.replace(bad, arm_features=None)
    with pytest.raises(CheckpointError, match="data/features"):
        load_checkpoint(dump_checkpoint(bad))


def test_graphed_exact_reads_the_data_rows_own_features():
    net = make_net(D, hidden=(8,), arm_feature_dim=F)
    data, table = make_data(40, D, A, seed=1), arm_features(A, F)
    sample = data.sample
    carried = dataclasses.replace(
        data, sample=Transitions(sample.x, sample.arms, sample.rewards, _own_rows(data, seed=7))
    )
    config = RofuConfig(step_size=0.1, steps=3, eta=0.01, minibatch_size=16)
    graphed = GraphedExact(net, carried, config, arm_features=table, capture=False)
    contexts = torch.randn(3, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = graphed(contexts, torch.Generator().manual_seed(3))
    want = _scores(net, contexts, carried, config, table, "fast")
    torch.testing.assert_close(got.ucb, want.ucb)
    assert not torch.allclose(got.ucb, _scores(net, contexts, data, config, table, "fast").ucb)
