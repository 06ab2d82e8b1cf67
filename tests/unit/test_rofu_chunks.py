"""How many pairs the exact estimator computes together (`rofu.models.rofu.chunk_pairs`), and
that the choice never changes a score."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rofu.models import RofuConfig, rofu_scores
from rofu.models.rofu import CHUNK_BYTES, MAX_CHUNK, chunk_pairs
from tests.factories import make_data, make_net

CPU = torch.device("cpu")


def test_a_set_chunk_size_is_taken_as_it_is():
    assert chunk_pairs(make_net(), RofuConfig(chunk_size=3), CPU, 10_000) == 3
    assert chunk_pairs(make_net(), RofuConfig(chunk_size=1000), torch.device("meta"), 9) == 1000


@pytest.mark.parametrize(
    ("hidden", "minibatch", "rows", "expected"),
    [
        ((100, 100), 256, 20_000, CHUNK_BYTES // (257 * 200 * 16)),  # the benchmark's MLP
        ((256, 256), 256, 20_000, CHUNK_BYTES // (257 * 512 * 16)),
        ((100,), 256, 20_000, CHUNK_BYTES // (257 * 100 * 16)),
        ((100,), 256, 50, CHUNK_BYTES // (51 * 100 * 16)),  # a minibatch beyond the sample
        ((16,), None, 40, MAX_CHUNK),  # small working sets stop at MAX_CHUNK
        ((4096, 4096), None, 20_000, 1),  # never less than one pair
    ],
)
def test_on_a_cpu_an_mlp_gets_as_many_pairs_as_fit_the_working_set(
    hidden, minibatch, rows, expected
):
    net = make_net(hidden=hidden)
    config = RofuConfig(minibatch_size=minibatch)
    assert chunk_pairs(net, config, CPU, rows) == expected
    assert 1 <= expected <= MAX_CHUNK


def test_elsewhere_or_for_another_model_the_chunk_is_max_chunk():
    net = make_net()
    assert chunk_pairs(net, RofuConfig(), torch.device("meta"), 20_000) == MAX_CHUNK
    other = torch.nn.Sequential(torch.nn.Linear(6, 4))
    assert chunk_pairs(other, RofuConfig(), CPU, 20_000) == MAX_CHUNK  # type: ignore[arg-type]


@pytest.mark.parametrize("kernel", ["fast", "functional"])
def test_the_default_chunks_score_as_one_pair_at_a_time_does(kernel):
    # 60 pairs with 2 kB a pair: the default puts them all in one chunk.
    net = make_net(hidden=(16, 16))
    data = make_data(300, 6, 4, n_total=900)
    contexts = torch.randn(15, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    config = RofuConfig(step_size=0.05, minibatch_size=64)
    assert chunk_pairs(net, config, CPU, 300) >= 60
    scores = {}
    for chunk in (None, 1, 7):
        cfg = dataclasses.replace(config, chunk_size=chunk)
        scores[chunk] = rofu_scores(
            net, contexts, data, cfg, torch.Generator().manual_seed(9), kernel=kernel
        )
    for chunk in (1, 7):
        torch.testing.assert_close(scores[chunk].mean, scores[None].mean, rtol=1e-10, atol=0)
        torch.testing.assert_close(scores[chunk].bonus, scores[None].bonus, rtol=1e-9, atol=1e-12)


def test_the_default_is_none_and_a_bad_chunk_size_is_refused():
    assert RofuConfig().chunk_size is None
    with pytest.raises(ValueError, match="chunk_size"):
        RofuConfig(chunk_size=0)
