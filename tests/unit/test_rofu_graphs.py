"""GraphedExact without a GPU: its static-buffer path (padding, buckets, masking) run
eagerly equals rofu_scores; on CUDA the same path is captured (the last test here, skipped
without a device)."""

from __future__ import annotations

import pytest
import torch

from rofu.models import RofuConfig, rofu_scores
from rofu.models.rofu_graphs import GraphedExact
from tests.factories import arm_features, make_data, make_net

CASES = [
    ("start, dataset", {}),
    ("drift, arm_count", {"baseline": "drift", "regulariser": "arm_count"}),
    ("start, arm_count with l2", {"regulariser": "arm_count", "l2": 0.2}),
    ("whole sample", {"minibatch_size": None}),
]


@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("batch", [1, 3, 4])
def test_graphed_exact_eager_path_equals_rofu_scores(name, kwargs, batch):
    net = make_net(hidden=(12,))
    data = make_data(150, 6, 4, n_total=600)
    config = RofuConfig(**{"step_size": 0.05, "minibatch_size": 24, **kwargs})
    graphed = GraphedExact(net, data, config, capture=False)
    contexts = torch.randn(batch, 6, generator=torch.Generator().manual_seed(batch)).double()
    candidates = torch.rand(batch, 4, generator=torch.Generator().manual_seed(1)) > 0.3
    candidates[:, 0] = True
    got = graphed(contexts, torch.Generator().manual_seed(5), candidates)
    want = rofu_scores(
        net, contexts, data, config, torch.Generator().manual_seed(5), candidates=candidates
    )
    assert graphed.bucket(batch) == {1: 1, 3: 4, 4: 4}[batch]
    torch.testing.assert_close(got.mean, want.mean, equal_nan=True)
    torch.testing.assert_close(got.bonus, want.bonus, equal_nan=True)


def test_graphed_exact_splits_batches_beyond_the_largest_bucket():
    features = arm_features(3, 2)
    net = make_net(hidden=(8,), arm_feature_dim=2)
    data = make_data(80, 6, 3)
    config = RofuConfig(step_size=0.05, minibatch_size=16)
    graphed = GraphedExact(net, data, config, arm_features=features, capture=False, buckets=(1, 2))
    contexts = torch.randn(5, 6, generator=torch.Generator().manual_seed(2)).double()
    got = graphed(contexts, torch.Generator().manual_seed(3))
    # One draw of minibatches for the whole call: every chunk of 2 shares it, so a
    # context's scores do not depend on the chunk it lands in.
    generator = torch.Generator().manual_seed(3)
    want = rofu_scores(net, contexts, data, config, generator, arm_features=features)
    torch.testing.assert_close(got.ucb, want.ucb)
    alone = graphed(contexts[4:], torch.Generator().manual_seed(3))
    torch.testing.assert_close(alone.ucb, got.ucb[4:])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"estimator": "ntk"}, "exact estimator only"),
        ({"baseline": "drift", "l2": 0.1}, "drift baseline with l2"),
    ],
)
def test_graphed_exact_refuses_what_it_cannot_capture(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GraphedExact(make_net(), make_data(20, 6, 4), RofuConfig(**kwargs))


def test_graphed_exact_capture_needs_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        GraphedExact(make_net(), make_data(20, 6, 4), RofuConfig(), capture=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphed_exact_captured_on_cuda_equals_rofu_scores():
    net = make_net(hidden=(16,), dtype=torch.float32).cuda()
    data = make_data(200, 6, 4, dtype=torch.float32)
    data = type(data)(data.sample.to("cuda"), data.n_total, data.arm_counts)
    config = RofuConfig(minibatch_size=32)
    graphed = GraphedExact(net, data, config)
    assert graphed.capture
    contexts = torch.randn(3, 6, device="cuda")
    for seed in (1, 2):  # the second call replays the captured graph with new inputs
        got = graphed(contexts, torch.Generator().manual_seed(seed))
        want = rofu_scores(net, contexts, data, config, torch.Generator().manual_seed(seed))
        torch.testing.assert_close(got.ucb, want.ucb, rtol=1e-4, atol=1e-5)
