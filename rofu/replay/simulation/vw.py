"""Vowpal Wabbit's contextual-bandit learners as external anchors for the replay harness.

Both policies run `vw --cb_explore_adf` (one multiline example per round, cost-sensitive
regression `--cb_type mtr`) with `--interactions sa`, so the shared context namespace `s`
is crossed with the per-arm namespace `a`: VW learns one linear cost model per arm (plus
a shared part and a per-arm bias). Each round is written in VW's ADF text format:

    shared |s c0:0.5 c3:-1.2        (context features; zeros are skipped)
    |a a=0                          (one line per candidate arm)
    0:-1.0:0.25 |a a=2              (when learning: action:cost:probability on the chosen arm)

VW minimises cost, so cost = -reward. VW returns a PMF over the candidate arms; the policy
samples from it with its own seeded generator (VW's sampling is not used), so a run is
determined by the seed. Needs the optional extra: `pip install 'rofu[vw]'`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rofu.models.data import Transitions
from rofu.models.policies.base import candidate_mask, check_batch, check_contexts, masked
from rofu.models.scores import Decision, Scores
from rofu.models.validation import check_float, check_int

#: Decisions remembered for `update`; the oldest is forgotten beyond this many.
MAX_PENDING = 65_536


def load_workspace() -> Any:
    """The `vowpalwabbit.Workspace` class, or an ImportError naming the extra to install."""
    try:
        from vowpalwabbit import Workspace
    except ImportError as error:
        raise ImportError(
            "the VW policies need the vowpalwabbit package: pip install 'rofu[vw]'"
        ) from error
    return Workspace


def adf_lines(x: np.ndarray, arms: list[int], label: tuple[int, float, float] | None) -> list[str]:
    """One round in VW's ADF text format.

    Args:
        x: (D,) context; zero features are left out.
        arms: the arm index of each action line.
        label: (arm, cost, probability) written on that arm's line, or None to predict.
    """
    features = " ".join(f"c{j}:{value:.9g}" for j, value in enumerate(x.tolist()) if value != 0)
    lines = [f"shared |s {features}".rstrip()]
    for arm in arms:
        prefix = ""
        if label is not None and label[0] == arm:
            prefix = f"{arm}:{label[1]:.9g}:{label[2]:.9g} "
        lines.append(f"{prefix}|a a={arm}")
    return lines


@dataclass(frozen=True)
class _Pending:
    """The last decision taken for a context: its arm, propensity and candidates."""

    arm: int
    propensity: float
    arms: list[int]


class VowpalWabbit:
    """A `Policy` backed by a `vw --cb_explore_adf` workspace; subclasses pick the explorer.

    Scores: `mean` is VW's predicted reward (minus its regression's predicted cost) for each
    candidate, NaN elsewhere; `bonus` is 0. The chosen arm is sampled from VW's PMF, not the
    argmax of `mean`, and its propensity is its PMF entry (renormalised in float64: VW
    reports float32).

    `update` labels a transition with the propensity recorded when `select` last chose an
    arm for the same context (and uses that decision's candidates as the action lines); a
    record is used once. Where there is no such record, or the arm differs from the one
    chosen (a round-robin warm start, a logged policy), it uses 1 / (number of action
    lines): all `n_arms` arms when the arm was not among recorded candidates. Epsilon-greedy
    (mtr) weights the regression by 1 / probability; VW's SquareCB ignores the probability
    (it regresses without importance weights).
    """

    name = "VW"

    def __init__(self, context_dim: int, n_arms: int, exploration: list[str], seed: int) -> None:
        self.context_dim = check_int("context_dim", context_dim, low=1)
        self.n_arms = check_int("n_arms", n_arms, low=1)
        self.seed = check_int("seed", seed, low=0)
        workspace = load_workspace()
        self.arguments = " ".join(
            ["--cb_explore_adf", "--cb_type mtr", "--interactions sa", *exploration]
            + [f"--random_seed {seed}", "--quiet"]
        )
        self.workspace: Any = workspace(self.arguments)
        self.rng = np.random.default_rng(seed)
        self._pending: OrderedDict[bytes, _Pending] = OrderedDict()

    def close(self) -> None:
        """Release VW's native workspace."""
        self.workspace.finish()

    def predict_pmf(
        self, contexts: Tensor, candidates: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """VW's PMF and predicted reward per candidate. (B, D), (B, A) -> (B, A), (B, A).

        Non-candidates get probability 0 and reward NaN. Does not learn.
        """
        contexts = check_contexts(contexts, self.context_dim)
        mask = candidate_mask(candidates, contexts.shape[0], self.n_arms)
        x = contexts.detach().cpu().double().numpy()
        pmf = torch.zeros(mask.shape, dtype=torch.float64)  # (B, A)
        reward = torch.full(mask.shape, float("nan"), dtype=torch.float64)  # (B, A)
        for row in range(x.shape[0]):
            arms = mask[row].nonzero().squeeze(1).tolist()
            probabilities, costs = self._predict_row(x[row], arms)
            pmf[row, arms] = torch.from_numpy(probabilities)
            reward[row, arms] = torch.from_numpy(0.0 - costs)  # 0.0 - 0.0 is +0.0
        return pmf, reward

    def _predict_row(self, x: np.ndarray, arms: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(PMF, predicted cost) over the action lines `arms`, both float64."""
        examples = self.workspace.parse(adf_lines(x, arms, None))
        try:
            probabilities = np.asarray(self.workspace.predict(examples), dtype=np.float64)
            # Each action line's raw regression output is its predicted cost.
            costs = np.array([e.get_partial_prediction() for e in examples[1:]], dtype=np.float64)
        finally:
            self.workspace.finish_example(examples)
        return probabilities / probabilities.sum(), costs

    def select(self, contexts: Tensor, candidates: Tensor | None = None) -> Decision:
        """Sample each arm from VW's PMF over the candidates; propensity = its PMF entry."""
        contexts = check_contexts(contexts, self.context_dim)
        mask = candidate_mask(candidates, contexts.shape[0], self.n_arms)
        pmf, reward = self.predict_pmf(contexts, mask)
        arms = self._sample(pmf)
        propensity = pmf.gather(1, arms[:, None]).squeeze(1)  # (B,)
        x = contexts.detach().cpu().double().numpy()
        for row, arm in enumerate(arms.tolist()):
            candidates_row = mask[row].nonzero().squeeze(1).tolist()
            self._remember(x[row], _Pending(arm, float(propensity[row]), candidates_row))
        scores = Scores(reward, torch.zeros_like(reward))
        return Decision(arms=arms, propensity=propensity, scores=masked(scores, mask))

    def _sample(self, pmf: Tensor) -> Tensor:
        """One arm per row by inverse CDF. (B, A) -> (B,) int64.

        A zero-probability arm is never drawn: its cumulative sum equals the one before it.
        """
        cumulative = pmf.cumsum(dim=1).numpy()  # (B, A)
        draws = self.rng.random(pmf.shape[0])  # (B,)
        arms = [
            min(int(np.searchsorted(cumulative[row], draws[row], side="right")), last)
            for row, last in enumerate((pmf > 0).cumsum(dim=1).argmax(dim=1).tolist())
        ]
        return torch.tensor(arms, dtype=torch.int64)

    def _remember(self, x: np.ndarray, decision: _Pending) -> None:
        key = x.tobytes()
        self._pending.pop(key, None)
        self._pending[key] = decision
        if len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)

    def update(self, batch: Transitions) -> dict[str, float]:
        """Learn from each row: cost = -reward, probability = the logged (or 1/A) propensity.

        Returns `rows` and `recorded_propensity`, how many rows found their own decision.
        """
        check_batch(batch, self.context_dim, self.n_arms)
        x = batch.x.detach().cpu().double().numpy()
        rewards = batch.rewards.detach().cpu().double().tolist()
        recorded = 0
        for row, arm in enumerate(batch.arms.tolist()):
            arms, propensity, found = self._logged(x[row], arm)
            recorded += found
            self.workspace.learn(adf_lines(x[row], arms, (arm, -rewards[row], propensity)))
        return {"rows": float(len(batch)), "recorded_propensity": float(recorded)}

    def _logged(self, x: np.ndarray, arm: int) -> tuple[list[int], float, bool]:
        """Action lines, propensity and whether `select` chose `arm` for this context."""
        pending = self._pending.pop(x.tobytes(), None)
        if pending is None or arm not in pending.arms:
            return list(range(self.n_arms)), 1.0 / self.n_arms, False
        if pending.arm != arm:
            return pending.arms, 1.0 / len(pending.arms), False
        return pending.arms, pending.propensity, True


class VowpalWabbitSquareCB(VowpalWabbit):
    """VW's SquareCB (Foster & Rakhlin 2020; `--squarecb`): inverse-gap weighting.

    The PMF puts 1 / (A + gamma * (cost_a - min cost)) on each non-best arm and the rest on
    the best, with gamma = gamma_scale * t ** gamma_exponent after t learned rounds (so it
    is uniform before the first update). The defaults are VW's own: gamma_scale = 10,
    gamma_exponent = 0.5 (passed explicitly, so a change of VW's defaults cannot move them).
    """

    name = "VW-SquareCB"

    def __init__(
        self,
        context_dim: int,
        n_arms: int,
        *,
        gamma_scale: float = 10.0,
        gamma_exponent: float = 0.5,
        seed: int = 0,
    ) -> None:
        self.gamma_scale = check_float("gamma_scale", gamma_scale, low=0.0, low_open=True)
        self.gamma_exponent = check_float("gamma_exponent", gamma_exponent, low=0.0)
        exploration = [
            "--squarecb",
            f"--gamma_scale {self.gamma_scale!r}",
            f"--gamma_exponent {self.gamma_exponent!r}",
        ]
        super().__init__(context_dim, n_arms, exploration, seed)


class VowpalWabbitEpsilonGreedy(VowpalWabbit):
    """VW's epsilon-greedy (`--epsilon`), default epsilon = 0.05.

    The PMF puts 1 - epsilon + epsilon / A on the lowest predicted cost (the first such
    candidate on ties, as before any learning) and epsilon / A on every other candidate.
    """

    name = "VW-EpsilonGreedy"

    def __init__(
        self, context_dim: int, n_arms: int, *, epsilon: float = 0.05, seed: int = 0
    ) -> None:
        self.epsilon = check_float("epsilon", epsilon, low=0.0, high=1.0)
        super().__init__(context_dim, n_arms, [f"--epsilon {self.epsilon!r}"], seed)
