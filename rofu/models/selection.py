"""ROFU's selection rule: the exact probability of each candidate, then one draw.

The rule turns the (B, A) values an arm is chosen by (the UCBs, or the means of a context
that asked not to explore) into choice probabilities, computed exactly, so that the
logged propensity is the probability the draw used:

- `argmax`: uniform over the arms tied at the best value (one arm, probability 1, unless
  values tie exactly; a cold start's +inf bounds all tie);
- `igw`: inverse-gap weighting (Foster & Rakhlin 2020, SquareCB): an arm whose value is
  gap below the best gets 1 / (K + gamma * gap), the best arms share the rest;
- an exploration floor eps mixes either with the uniform choice:
  p = (1 - eps) * p_rule + eps / K, so every candidate keeps at least eps / K.

A context that does not explore gets the argmax alone (no floor, no igw). The draw is an
inverse-CDF lookup of one uniform number per context, so the arm follows the
probabilities exactly (up to float64 rounding of their cumulative sums).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rofu.models.validation import check_choice, check_float

SELECTIONS = ("argmax", "igw")


@dataclass(frozen=True)
class SelectionRule:
    """How the values of the candidates become choice probabilities.

    Attributes:
        selection: `argmax` (ties uniform) or `igw` (inverse-gap weighting).
        exploration_floor: eps in [0, 1], the weight of the uniform choice mixed in.
        igw_gamma: gamma >= 0 of `igw`, in inverse value units (0: uniform).
    """

    selection: str = "argmax"
    exploration_floor: float = 0.0
    igw_gamma: float = 100.0

    def __post_init__(self) -> None:
        check_choice("selection", self.selection, SELECTIONS)
        check_float("exploration_floor", self.exploration_floor, low=0.0, high=1.0)
        check_float("igw_gamma", self.igw_gamma, low=0.0)

    @property
    def randomises(self) -> bool:
        """Whether the rule puts mass on arms that are not tied at the best value."""
        return self.selection != "argmax" or self.exploration_floor > 0.0


ARGMAX = SelectionRule()


def _ranked(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(values with -inf off the mask and for NaN, best (B, 1), ties (B, A) bool)."""
    v = values.detach().cpu().double()
    v = v.masked_fill(v.isnan() | ~mask, float("-inf"))  # (B, A)
    best = v.max(dim=1, keepdim=True).values  # (B, 1)
    ties = (v == best) & mask  # (B, A); +inf values tie with each other
    return v, best, ties


def tie_probabilities(values: Tensor, mask: Tensor) -> Tensor:
    """Uniform over the candidates tied at the best value. (B, A), (B, A) bool -> (B, A)."""
    _, _, ties = _ranked(values, mask)
    return ties.double() / ties.sum(dim=1, keepdim=True)


def igw_probabilities(values: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Inverse-gap weighting: 1 / (K + gamma * gap) off the best, the rest shared by the
    tied best arms. (B, A), (B, A) bool -> (B, A); 0 off the mask."""
    v, best, ties = _ranked(values, mask)
    k = mask.sum(dim=1, keepdim=True).double()  # (B, 1)
    others = mask & ~ties
    gap = torch.where(others, best - v, torch.zeros_like(v))  # +inf below a +inf best
    penalty = gamma * gap if gamma > 0 else torch.zeros_like(gap)  # never 0 * inf
    weight = torch.where(others, 1.0 / (k + penalty), torch.zeros_like(v))  # each <= 1/K
    rest = 1.0 - weight.sum(dim=1, keepdim=True)  # >= (ties) / K > 0
    return torch.where(ties, rest / ties.sum(dim=1, keepdim=True), weight)


def choice_probabilities(
    values: Tensor, mask: Tensor, rule: SelectionRule, explore: Tensor | None = None
) -> Tensor:
    """The probability of each candidate under `rule`.

    Args:
        values: (B, A) what the arms are ranked by (mean + bonus, or the mean).
        mask: (B, A) bool candidates; every row needs one.
        rule: the selection rule.
        explore: (B,) bool; False: that row takes the argmax alone. None: all explore.

    Returns:
        (B, A) float64 probabilities, 0 off the mask, each row summing to 1.
    """
    mask = mask.cpu()
    greedy = tie_probabilities(values, mask)
    if not rule.randomises:
        return greedy
    chosen = greedy
    if rule.selection == "igw":
        chosen = igw_probabilities(values, mask, rule.igw_gamma)
    eps = rule.exploration_floor
    uniform = mask.double() / mask.sum(dim=1, keepdim=True)
    mixed = (1.0 - eps) * chosen + eps * uniform
    if explore is None:
        return mixed
    return torch.where(explore.cpu()[:, None], mixed, greedy)


def draw_arms(probabilities: Tensor, uniforms: Tensor) -> Tensor:
    """One arm per row by inverse CDF: the first arm whose cumulative probability exceeds
    u * total. An arm of probability 0 is never drawn. (B, A), (B,) in [0, 1) -> (B,)."""
    cdf = probabilities.double().cumsum(dim=1)  # (B, A)
    target = uniforms.double()[:, None] * cdf[:, -1:]  # (B, 1)
    arms = (cdf <= target).sum(dim=1)  # (B,)
    positive = probabilities > 0
    last = positive.shape[1] - 1 - positive.flip(1).int().argmax(dim=1)  # rounding guard
    return torch.minimum(arms, last)
