"""What every policy returns: per-arm mean and bonus, and the decision taken from them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class ArmScore:
    """One candidate's estimates for one context, as logged and returned by /select.

    Attributes:
        arm: the arm's id.
        mean: estimated reward; None on a cold start (nothing was scored).
        bonus: exploration bonus; None on a cold start.
        ucb: mean + bonus, the value an exploring choice is made by; None on a cold start.
    """

    arm: str
    mean: float | None
    bonus: float | None
    ucb: float | None

    @classmethod
    def unscored(cls, arm: str) -> ArmScore:
        """A candidate of a cold start."""
        return cls(arm, None, None, None)


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

    def per_arm(self, row: int, arms: Iterable[tuple[int, str]]) -> list[ArmScore]:
        """Row `row`'s scores of the given (column, arm id) pairs, in that order."""
        mean, bonus = self.mean[row].tolist(), self.bonus[row].tolist()
        return [
            ArmScore(arm, mean[column], bonus[column], mean[column] + bonus[column])
            for column, arm in arms
        ]


@dataclass(frozen=True)
class Decision:
    """The arms a policy chose for a batch of contexts.

    Attributes:
        arms: (B,) int64 chosen arm per context.
        propensity: (B,) probability with which that arm was chosen.
        scores: the (B, A) scores the choice was made from.
        probabilities: (B, A) float64 probability of every arm (0 off the candidates),
            where the policy computes them exactly (ROFU's rule); else None.
    """

    arms: Tensor
    propensity: Tensor
    scores: Scores
    probabilities: Tensor | None = None
