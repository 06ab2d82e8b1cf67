"""ROFU's selection rule (rofu.models.selection, rofu.models.policies.base.rofu_decide): exact
probabilities for ties, the exploration floor and inverse-gap weighting, and a draw that
follows them."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from rofu.models import RewardNetConfig, RofuConfig, Scores, Transitions
from rofu.models.policies import RofuPolicy, TrainSchedule
from rofu.models.policies.base import greedy_decision, rofu_decide
from rofu.models.selection import (
    SelectionRule,
    choice_probabilities,
    draw_arms,
    igw_probabilities,
    tie_probabilities,
)
from rofu.models.training import FitConfig

INF = float("inf")


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _mask(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def test_selection_ties_share_the_mass_and_non_candidates_get_none() -> None:
    values = _t([[1.0, 3.0, 3.0, 2.0], [5.0, 3.0, 3.0, 2.0], [INF, 0.0, INF, INF]])
    mask = _mask([[1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 0]])
    p = tie_probabilities(values, mask)
    torch.testing.assert_close(p, _t([[0, 0.5, 0.5, 0], [0, 0.5, 0.5, 0], [0.5, 0, 0.5, 0]]))


def test_selection_cold_start_bounds_tie_uniformly() -> None:
    values = torch.full((1, 5), INF, dtype=torch.float64)
    mask = _mask([[1, 0, 1, 1, 0]])
    p = choice_probabilities(values, mask, SelectionRule(exploration_floor=0.3))
    torch.testing.assert_close(p, _t([[1 / 3, 0, 1 / 3, 1 / 3, 0]]))


def test_selection_floor_mixes_the_argmax_with_a_uniform_choice() -> None:
    values = _t([[0.1, 0.9, 0.5, 0.2]])
    mask = _mask([[1, 1, 1, 0]])
    p = choice_probabilities(values, mask, SelectionRule(exploration_floor=0.3))
    torch.testing.assert_close(p, _t([[0.1, 0.8, 0.1, 0.0]]))  # 0.3 / 3 each, 0.7 + 0.1


def test_selection_igw_weights_by_the_gap_to_the_best() -> None:
    values = _t([[1.0, 0.9, 0.5], [1.0, 1.0, 0.0]])
    mask = torch.ones(2, 3, dtype=torch.bool)
    p = igw_probabilities(values, mask, gamma=10.0)
    # K = 3: gap 0.1 -> 1 / 4, gap 0.5 -> 1 / 8, the best takes the rest; tied bests share
    expected = _t([[0.625, 0.25, 0.125], [6 / 13, 6 / 13, 1 / 13]])
    torch.testing.assert_close(p, expected)


def test_selection_igw_limits_uniform_and_greedy() -> None:
    values = _t([[1.0, 0.9, 0.5, INF]])
    mask = _mask([[1, 1, 1, 0]])
    uniform = igw_probabilities(values, mask, gamma=0.0)
    torch.testing.assert_close(uniform, _t([[1 / 3, 1 / 3, 1 / 3, 0]]))
    sharp = igw_probabilities(values, mask, gamma=1e12)
    torch.testing.assert_close(sharp, _t([[1.0, 0.0, 0.0, 0.0]]), atol=1e-10, rtol=0)
    infinite = igw_probabilities(_t([[INF, 0.0, 1.0]]), torch.ones(1, 3, dtype=torch.bool), 5.0)
    torch.testing.assert_close(infinite, _t([[1.0, 0.0, 0.0]]))


def test_selection_igw_with_a_floor_sums_to_one_and_keeps_the_floor() -> None:
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(50, 6, generator=generator, dtype=torch.float64)
    mask = torch.rand(50, 6, generator=generator) > 0.4
    mask[:, 0] = True
    rule = SelectionRule(selection="igw", exploration_floor=0.1, igw_gamma=20.0)
    p = choice_probabilities(values, mask, rule)
    torch.testing.assert_close(p.sum(dim=1), torch.ones(50, dtype=torch.float64))
    k = mask.sum(dim=1, keepdim=True).double()
    assert bool((p[~mask] == 0).all())
    assert bool(((p >= 0.1 / k - 1e-15) | ~mask).all())


def test_selection_a_context_that_does_not_explore_takes_the_argmax_alone() -> None:
    values = _t([[0.1, 0.9, 0.5], [0.1, 0.9, 0.5]])
    mask = torch.ones(2, 3, dtype=torch.bool)
    rule = SelectionRule(selection="igw", exploration_floor=0.5)
    p = choice_probabilities(values, mask, rule, explore=torch.tensor([True, False]))
    assert bool((p[0] > 0).all())
    torch.testing.assert_close(p[1], _t([[0.0, 1.0, 0.0]])[0])


def test_selection_draw_follows_the_probabilities_exactly() -> None:
    p = _t([[0.0, 0.25, 0.0, 0.5, 0.25, 0.0]])
    n = 4000  # a regular grid of uniforms: each arm's share is its probability to 1 / n
    uniforms = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    arms = draw_arms(p.expand(n, -1), uniforms)
    counts = torch.bincount(arms, minlength=6).double() / n
    torch.testing.assert_close(counts, p[0], atol=1 / n, rtol=0)
    edges = torch.tensor([0.0, 0.25, 0.75, 1 - 2**-53], dtype=torch.float64)
    assert draw_arms(p.expand(4, -1), edges).tolist() == [1, 3, 4, 4]


def test_selection_rule_refuses_bad_settings_naming_them() -> None:
    with pytest.raises(ValueError, match="exploration_floor"):
        RofuConfig(exploration_floor=1.5)
    with pytest.raises(ValueError, match="selection"):
        RofuConfig(selection="softmax")
    with pytest.raises(ValueError, match="igw_gamma"):
        SelectionRule(igw_gamma=-1.0)
    assert not SelectionRule().randomises
    assert SelectionRule(exploration_floor=0.01).randomises
    assert RofuConfig(selection="igw", igw_gamma=3.0).rule == SelectionRule("igw", 0.0, 3.0)


def _scores(batch: int, arms: int, seed: int) -> Scores:
    generator = torch.Generator().manual_seed(seed)
    mean = torch.randn(batch, arms, generator=generator, dtype=torch.float64)
    bonus = torch.rand(batch, arms, generator=generator, dtype=torch.float64)
    return Scores(mean, bonus)


def test_rofu_decide_reports_every_probability_and_the_chosen_ones_propensity() -> None:
    scores = _scores(40, 5, seed=1)
    mask = torch.rand(40, 5, generator=torch.Generator().manual_seed(2)) > 0.3
    mask[:, 4] = True
    rule = SelectionRule(selection="igw", exploration_floor=0.05, igw_gamma=4.0)
    decision = rofu_decide(scores, mask, torch.Generator().manual_seed(3), rule=rule)
    assert decision.probabilities is not None
    chosen = decision.probabilities.gather(1, decision.arms[:, None]).squeeze(1)
    assert torch.equal(decision.propensity, chosen)
    assert bool(mask.gather(1, decision.arms[:, None]).all())
    torch.testing.assert_close(decision.probabilities.sum(1), torch.ones(40, dtype=torch.float64))


def test_rofu_decide_argmax_keeps_the_tie_break_stream_of_the_greedy_rule() -> None:
    """Without a randomising rule the draws (and so every replay run) are unchanged."""
    scores = Scores(
        torch.zeros(30, 4, dtype=torch.float64), torch.zeros(30, 4, dtype=torch.float64)
    )
    mask = torch.ones(30, 4, dtype=torch.bool)
    got = rofu_decide(scores, mask, torch.Generator().manual_seed(7))
    want = greedy_decision(scores, mask, torch.Generator().manual_seed(7))
    assert torch.equal(got.arms, want.arms)
    assert torch.equal(got.propensity, want.propensity)
    assert got.probabilities is not None
    assert bool((got.probabilities == 0.25).all())


def test_rofu_decide_needs_a_source_of_randomness() -> None:
    with pytest.raises(ValueError, match="generator or uniforms"):
        rofu_decide(None, torch.ones(1, 2, dtype=torch.bool), None)
    decision = rofu_decide(
        None, torch.ones(2, 4, dtype=torch.bool), None, uniforms=torch.tensor([0.1, 0.9])
    )
    assert decision.arms.tolist() == [0, 3]
    assert decision.propensity.tolist() == [0.25, 0.25]


def test_rofu_decide_choice_frequencies_match_the_probabilities() -> None:
    """Chi-square at a fixed seed: the generator's draws follow the stated probabilities."""
    n = 4000
    values = _t([[0.3, 0.5, 0.45, -0.7]]).expand(n, -1)
    base = Scores(values, torch.zeros_like(values))
    mask = torch.ones(n, 4, dtype=torch.bool)
    rule = SelectionRule(selection="igw", exploration_floor=0.1, igw_gamma=10.0)
    decision = rofu_decide(base, mask, torch.Generator().manual_seed(11), rule=rule)
    assert decision.probabilities is not None
    expected = decision.probabilities[0] * n
    assert bool((decision.probabilities == decision.probabilities[0]).all())
    observed = torch.bincount(decision.arms, minlength=4).double()
    result = chisquare(observed.numpy(), expected.numpy())
    assert result.pvalue > 0.01, (observed.tolist(), expected.tolist())
    assert math.isclose(float(decision.probabilities[0].sum()), 1.0)


def test_rofu_policy_with_a_floor_logs_exact_probabilities() -> None:
    net = RewardNetConfig(context_dim=3, n_arms=4, hidden=(8,), seed=0)
    schedule = TrainSchedule(every=1, fit=FitConfig(steps=2, batch_size=8))
    params = RofuConfig(exploration_floor=0.2, minibatch_size=8, estimator="ntk")
    policy = RofuPolicy(net, schedule, params, seed=0)
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    cold = policy.select(x)
    assert cold.probabilities is not None
    assert bool((cold.probabilities == 0.25).all())
    policy.update(Transitions(x, cold.arms, torch.ones(6)))
    decision = policy.select(x)
    assert decision.probabilities is not None
    assert bool((decision.probabilities >= 0.05 - 1e-15).all())  # eps / K = 0.2 / 4
    chosen = decision.probabilities.gather(1, decision.arms[:, None]).squeeze(1)
    assert torch.equal(decision.propensity, chosen)
