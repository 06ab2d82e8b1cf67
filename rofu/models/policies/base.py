"""The policy protocol and the decision rules every policy shares.

Every policy scores each candidate arm as mean + bonus (`Scores`); the arm is the argmax
of that sum, ties broken uniformly at random, so argmax, propensity and logging are
shared. ROFU's rule (`rofu_decide`) adds its cold start, the per-context choice not to
explore and the selection rule of `rofu.models.selection` (exploration floor, inverse-gap
weighting), with every candidate's exact probability. Thompson policies put a sampled
deviation in `bonus` and estimate their propensity by re-sampling (`sampled_propensity`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from rofu.models.data import Transitions
from rofu.models.scores import Decision, Scores
from rofu.models.selection import ARGMAX, SelectionRule, choice_probabilities, draw_arms
from rofu.models.validation import check_context_batch, check_index_tensor, check_mask_tensor


class Policy(Protocol):
    """What the replay harness calls. (The service scores with `rofu_scores` and decides
    with `rofu_decide`, ROFU's one decision rule, which `RofuPolicy` applies too.)"""

    name: str
    n_arms: int

    def select(self, contexts: Tensor, candidates: Tensor | None = None) -> Decision:
        """Choose an arm per context. (B, D), (B, A) bool -> Decision."""
        ...

    def update(self, batch: Transitions) -> dict[str, float]:
        """Learn from observed rewards; returns training metrics."""
        ...


def candidate_mask(candidates: Tensor | None, batch: int, n_arms: int) -> Tensor:
    """A validated (B, A) candidate mask; None means every arm; each row needs one arm."""
    if candidates is None:
        return torch.ones(batch, n_arms, dtype=torch.bool)
    mask = check_mask_tensor("candidates", candidates.cpu(), (batch, n_arms))
    if not bool(mask.any(dim=1).all()):
        raise ValueError("candidates must allow at least one arm per context")
    return mask


def check_contexts(contexts: Tensor, context_dim: int | tuple[int, ...]) -> Tensor:
    """Validate a (B, D) batch of contexts, or (B, *shape) for a tuple `context_dim`."""
    return check_context_batch("contexts", contexts, _shape(context_dim))


def check_batch(batch: Transitions, context_dim: int | tuple[int, ...], n_arms: int) -> Transitions:
    """Validate an update batch against the policy's dimensions (a tuple `context_dim`
    is the shape of one context)."""
    if not isinstance(batch, Transitions):
        raise TypeError(f"batch must be Transitions, got {type(batch).__name__}")
    check_context_batch("batch.x", batch.x, _shape(context_dim))
    check_index_tensor("batch.arms", batch.arms, ndim=1, upper=n_arms)
    return batch


def _shape(context_dim: int | tuple[int, ...]) -> tuple[int, ...]:
    return context_dim if isinstance(context_dim, tuple) else (context_dim,)


def masked(scores: Scores, mask: Tensor) -> Scores:
    """Scores with NaN outside the candidate mask."""
    nan = torch.tensor(float("nan"), dtype=scores.mean.dtype, device=scores.mean.device)
    keep = mask.to(scores.mean.device)
    return Scores(torch.where(keep, scores.mean, nan), torch.where(keep, scores.bonus, nan))


def argmax_arms(values: Tensor, mask: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Argmax over candidates, ties uniformly at random. (B, A) -> arms (B,), ties (B,)."""
    values = values.detach().cpu().double().masked_fill(~mask, float("-inf"))
    best = values.max(dim=1, keepdim=True).values  # (B, 1)
    ties = (values == best) & mask  # (B, A); +inf bonuses tie with each other
    noise = torch.rand(values.shape, generator=generator, dtype=torch.float64)
    arms = noise.masked_fill(~ties, -1.0).argmax(dim=1)  # (B,)
    return arms, ties.sum(dim=1).double()


def greedy_decision(scores: Scores, mask: Tensor, generator: torch.Generator) -> Decision:
    """Argmax of mean + bonus; propensity 1 / (number of tied arms)."""
    arms, n_ties = argmax_arms(scores.ucb, mask, generator)
    return Decision(arms=arms, propensity=1.0 / n_ties, scores=masked(scores, mask))


def cold_start_scores(candidates: Tensor) -> Scores:
    """(B, A) scores of a cold start: mean 0, bonus +inf for every arm."""
    zeros = torch.zeros(candidates.shape, dtype=torch.float64)
    return Scores(zeros, torch.full_like(zeros, float("inf")))


def rofu_decide(
    scores: Scores | None,
    candidates: Tensor,
    generator: torch.Generator | None,
    *,
    explore: Tensor | None = None,
    rule: SelectionRule = ARGMAX,
    uniforms: Tensor | None = None,
) -> Decision:
    """ROFU's decision rule, the one the service and `RofuPolicy` both apply.

    A cold start (no trained model, or no data to measure its uncertainty against) gives
    every candidate an upper bound of +inf, so the choice is uniform, propensity 1 / K.
    Otherwise `rule` (`rofu.models.selection`) turns mean + bonus over the candidates (the mean
    alone for a context that asked not to explore, which takes the argmax) into exact
    choice probabilities: the argmax with ties uniform, or inverse-gap weighting, mixed
    with a uniform choice of weight `rule.exploration_floor`. The returned propensity is
    the chosen arm's probability, and `probabilities` holds every arm's.

    Args:
        scores: (B, A) means and bonuses from `rofu_scores`, or None when there is no
            trained model or no data to measure its uncertainty against.
        candidates: (B, A) bool, the arms each context may get.
        generator: draws the choice when `uniforms` is None.
        explore: (B,) bool; False ranks that context's candidates by the mean alone.
            None: every context explores.
        rule: the selection rule (default: argmax, no floor).
        uniforms: (B,) numbers in [0, 1), one per context, that the draw uses instead of
            the generator (the service derives them from each event's id).

    Raises:
        ValueError: neither a generator nor uniforms.
    """
    if scores is None:
        scores = cold_start_scores(candidates)
    mean, bonus = scores.mean.detach().cpu(), scores.bonus.detach().cpu()
    if explore is not None:
        bonus = torch.where(explore.cpu()[:, None], bonus, torch.zeros_like(bonus))
    values = mean + bonus  # (B, A)
    mask = candidates.cpu()
    probabilities = choice_probabilities(values, mask, rule, explore)  # (B, A)
    if uniforms is None and generator is None:
        raise ValueError("rofu_decide needs a generator or uniforms to draw from")
    if uniforms is None and not rule.randomises:
        assert generator is not None
        arms, _ = argmax_arms(values, mask, generator)  # the tie-break stream replays keep
    else:
        if uniforms is None:
            uniforms = torch.rand(mask.shape[0], generator=generator, dtype=torch.float64)
        arms = draw_arms(probabilities, uniforms.cpu())
    propensity = probabilities.gather(1, arms[:, None]).squeeze(1)  # (B,)
    return Decision(arms, propensity, masked(Scores(mean, bonus), mask), probabilities)


def epsilon_decision(
    scores: Scores, mask: Tensor, epsilon: float, generator: torch.Generator
) -> Decision:
    """With probability epsilon a uniform candidate, else the argmax; exact propensity."""
    greedy, n_ties = argmax_arms(scores.ucb, mask, generator)
    n_candidates = mask.sum(dim=1).double()  # (B,)
    explore = torch.rand(mask.shape[0], generator=generator, dtype=torch.float64) < epsilon
    uniform = torch.multinomial(mask.double(), 1, generator=generator).squeeze(1)  # (B,)
    arms = torch.where(explore, uniform, greedy)
    values = scores.ucb.detach().cpu().double().masked_fill(~mask, float("-inf"))
    best = values.max(dim=1).values
    is_best = values.gather(1, arms[:, None]).squeeze(1) == best  # (B,)
    propensity = epsilon / n_candidates + (1.0 - epsilon) * is_best.double() / n_ties
    return Decision(arms=arms, propensity=propensity, scores=masked(scores, mask))


def uniform_decision(scores: Scores, mask: Tensor, generator: torch.Generator) -> Decision:
    """A uniform candidate; propensity 1 / (number of candidates)."""
    arms = torch.multinomial(mask.double(), 1, generator=generator).squeeze(1)
    return Decision(
        arms=arms, propensity=1.0 / mask.sum(dim=1).double(), scores=masked(scores, mask)
    )


def sampled_propensity(
    draw: Callable[[], Tensor], arms: Tensor, mask: Tensor, samples: int, generator: torch.Generator
) -> Tensor:
    """Monte Carlo propensity of a Thompson choice.

    Counts how often the chosen arm wins in `samples` fresh posterior draws, counting the
    draw that chose it too: (1 + wins) / (1 + samples), so it is never zero.

    Args:
        draw: returns one (B, A) sampled score table per call.
        arms: (B,) the arms chosen from the first draw.
        mask: (B, A) candidates.
        samples: number of extra draws (0 gives 1.0, an uninformative value).
        generator: breaks ties in the extra draws.
    """
    wins = torch.ones(arms.shape, dtype=torch.float64)
    for _ in range(samples):
        winners, _ = argmax_arms(draw(), mask, generator)
        wins += (winners == arms).double()
    return wins / (1 + samples)
