"""What every policy returns: per-arm mean and bonus, and the decision taken from them."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Scores:
    """Per (context, arm) estimates; the optimistic score is `mean + bonus`.

    Attributes:
        mean: (B, A) estimated reward; NaN for arms that were not candidates.
        bonus: (B, A) exploration bonus (a sampled deviation for Thompson policies).
    """

    mean: Tensor
    bonus: Tensor

    @property
    def ucb(self) -> Tensor:
        """(B, A) the score the arm is chosen by: mean + bonus."""
        return self.mean + self.bonus


@dataclass(frozen=True)
class Decision:
    """The arms a policy chose for a batch of contexts.

    Attributes:
        arms: (B,) int64 chosen arm per context.
        propensity: (B,) probability with which that arm was chosen.
        scores: the (B, A) scores the choice was made from.
    """

    arms: Tensor
    propensity: Tensor
    scores: Scores
