"""Neural policies: the shared base, Greedy / EpsilonGreedy and ROFU (NeuralUCB is in
`rofu.models.policies.neural_ucb`)."""

from __future__ import annotations

import dataclasses
from typing import Generic, TypeVar

import torch
from torch import Tensor

from rofu.models.data import DataBuffer, Transitions
from rofu.models.learners import LearnerFamily, default_candidates
from rofu.models.networks import RewardNet
from rofu.models.policies.base import (
    candidate_mask,
    check_batch,
    check_contexts,
    epsilon_decision,
    greedy_decision,
    rofu_decide,
)
from rofu.models.policies.params import EpsilonGreedyParams
from rofu.models.prepared import PreparedModel, prepare, score
from rofu.models.presets import PRODUCT
from rofu.models.reward_model import RewardModel, RewardModelConfig
from rofu.models.rofu import RofuConfig
from rofu.models.scaling import squared_residuals
from rofu.models.scores import Decision, Scores
from rofu.models.training import (
    FitConfig,
    TrainSchedule,
    fit,
    learner_net_config,
    make_optimizer,
)
from rofu.models.validation import check_float_tensor, check_int


def _arm_features(net: RewardModel, arm_features: Tensor | None) -> Tensor | None:
    """Validated (A, F) arm features on the network's device and dtype (None when per-arm)."""
    if net.per_arm_outputs:
        if arm_features is not None:
            raise ValueError("arm_features must be None for a network with one output per arm")
        return None
    if arm_features is None:
        raise ValueError("arm_features is required by an arm-feature network")
    checked = check_float_tensor(
        "arm_features", arm_features, ndim=2, size={1: net.arm_feature_dim}
    )
    first = next(net.parameters())
    return checked.to(first.device, first.dtype)


def require_mlp(net: RewardModel, policy: str) -> RewardNet:
    """`net` as a `RewardNet`, for the policies that read its hidden layers; TypeError else."""
    if not isinstance(net, RewardNet):
        raise TypeError(
            f"net_config must build a RewardNet (an MLP) for {policy}, got {type(net).__name__}"
        )
    return net


ParamsT = TypeVar("ParamsT")


class NeuralPolicy(Generic[ParamsT]):
    """Holds a reward model, its data buffer, generators, the training schedule and the
    policy's hyper-parameters (`params`, a frozen dataclass).

    The model is built from `net_config`: a `RewardNetConfig` (the MLP), a
    `ConvRewardNetConfig` (image contexts), or any `RewardModelConfig`. Greedy,
    EpsilonGreedy, ROFU, NeuralUCB and ParamNoise take any of them; NeuralLinear,
    Bootstrap and Dropout read the MLP's layers and need a `RewardNetConfig`. The model
    stays in eval mode except while `fit` trains it.

    This is every neural policy's one constructor. A subclass declares `Params` (its
    hyper-parameter dataclass), optionally `default_params` (else `Params()`) and
    `default_schedule` (else `TrainSchedule()`), and builds its own state in `_setup`.

    Args:
        net_config: builds the reward model (`net_config.build()`).
        schedule: when and how the network is refitted; None: `default_schedule`.
        params: the policy's hyper-parameters, a `Params`; None: `default_params`.
        arm_features: (A, F) features of an arm-feature network; None for one with an
            output per arm.
        device: where the network lives.
        seed: seeds tie-breaks, exploration and training (the network's initialisation
            has its own seed, `net_config.seed`).

    Raises:
        TypeError: `schedule` or `params` of the wrong type, or a model the policy
            cannot use.
        ValueError: a bad seed or arm features.
    """

    name = "Neural"
    Params: type[ParamsT]
    default_params: ParamsT | None = None
    default_schedule: TrainSchedule | None = None

    def __init__(
        self,
        net_config: RewardModelConfig,
        schedule: TrainSchedule | None = None,
        params: ParamsT | None = None,
        *,
        arm_features: Tensor | None = None,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ) -> None:
        check_int("seed", seed, low=0)
        self.params = self._check_params(params)
        self.schedule = self._check_schedule(schedule)
        net_config = learner_net_config(net_config, self.schedule.fit)
        self.net = self._net_config(net_config).build().to(device).eval()
        self.arm_features = _arm_features(self.net, arm_features)
        self.n_arms = self.net.arm_count(self.arm_features)
        self.context_shape = self.net.context_shape
        self.device = torch.device(device)
        self.buffer = DataBuffer(
            self.context_shape, device=device, window=self.schedule.window or None
        )
        self.generator = torch.Generator().manual_seed(seed)
        self.fit_generator = torch.Generator().manual_seed(seed + 1_000_003)
        self._optimizers: dict[int, tuple[FitConfig, torch.optim.Optimizer]] = {}
        self._setup(seed)

    def _check_params(self, params: ParamsT | None) -> ParamsT:
        """`params`, or the class's defaults for None; TypeError for another type."""
        if params is None:
            return self.Params() if self.default_params is None else self.default_params
        if not isinstance(params, self.Params):
            raise TypeError(
                f"params must be a {self.Params.__name__} for {type(self).__name__}, "
                f"got {type(params).__name__}"
            )
        return params

    def _check_schedule(self, schedule: TrainSchedule | None) -> TrainSchedule:
        if schedule is None:
            return self.default_schedule or TrainSchedule()
        if not isinstance(schedule, TrainSchedule):
            raise TypeError(f"schedule must be a TrainSchedule, got {type(schedule).__name__}")
        return schedule

    def _net_config(self, config: RewardModelConfig) -> RewardModelConfig:
        """The network the policy builds from `net_config` (a hook; Dropout adds dropout)."""
        return config

    def _setup(self, seed: int) -> None:
        """Build the policy's own state once the network, buffer and generators exist."""

    def optimizer_for(self, net: RewardModel) -> torch.optim.Optimizer | None:
        """The optimizer a refit of `net` continues (schedule.persist), else None: fresh.

        A new one starts whenever the schedule's FitConfig has changed since the last.
        """
        if not self.schedule.persist:
            return None
        kept = self._optimizers.get(id(net))
        if kept is None or kept[0] != self.schedule.fit:
            kept = (self.schedule.fit, make_optimizer(net, self.schedule.fit))
            self._optimizers[id(net)] = kept
        return kept[1]

    def _prepare(self, contexts: Tensor, candidates: Tensor | None) -> tuple[Tensor, Tensor]:
        contexts = check_contexts(contexts, self.context_shape)
        mask = candidate_mask(candidates, contexts.shape[0], self.n_arms)
        return contexts.to(self.device, next(self.net.parameters()).dtype), mask

    def predict(self, contexts: Tensor) -> Tensor:
        """(B, *context_shape) -> (B, A) mean rewards of the current network."""
        with torch.no_grad():
            return self.net.score_all(contexts, self.arm_features)

    def update(self, batch: Transitions) -> dict[str, float]:
        """Score the batch with the current network (its prequential residuals, kept in
        the buffer's `noise`), fold it into a standardising network's statistics, store
        it; refit when the schedule says so."""
        check_batch(batch, self.context_shape, self.n_arms)
        self.observe(batch)
        before = self.buffer.n_seen
        self.buffer.append(batch)
        if not self.schedule.due(before, self.buffer.n_seen):
            return {"rows": float(len(self.buffer)), "trained": 0.0}
        return self.train() | {"trained": 1.0}

    def observe(self, batch: Transitions) -> None:
        """What the learner learns of new rows before any refit on them: the current
        network's squared residuals (`DataBuffer.score_residuals`) and, for a
        standardising network, its running statistics."""
        squared = squared_residuals(self.net, batch, self.arm_features)
        self.buffer.score_residuals(squared, self.schedule.fit.prequential_decay)
        if isinstance(self.net, RewardNet):
            first = next(self.net.parameters())
            self.net.observe(batch.x.to(first), batch.rewards.to(first))

    def train(self) -> dict[str, float]:
        """Refit the network on everything in the buffer."""
        return fit(
            self.net,
            self.buffer.view(),
            self.schedule.fit,
            self.fit_generator,
            arm_features=self.arm_features,
            optimizer=self.optimizer_for(self.net),
        )


class EpsilonGreedy(NeuralPolicy[EpsilonGreedyParams]):
    """Argmax of the network's mean with probability 1 - epsilon, else uniform.

    Defaults: the Showdown's `RMS` schedule (SHOWDOWN_FIT every 50 rounds) and
    `EpsilonGreedyParams()`, epsilon = 0.05.
    """

    name = "EpsilonGreedy"
    Params = EpsilonGreedyParams

    @property
    def epsilon(self) -> float:
        """The probability of a uniform candidate."""
        return self.params.epsilon

    def select(self, contexts: Tensor, candidates: Tensor | None = None) -> Decision:
        """Epsilon-greedy on the network's mean; exact propensity."""
        contexts, mask = self._prepare(contexts, candidates)
        mean = self.predict(contexts).cpu()
        scores = Scores(mean, torch.zeros_like(mean))
        if self.epsilon == 0.0:
            return greedy_decision(scores, mask, self.generator)
        return epsilon_decision(scores, mask, self.epsilon, self.generator)


class Greedy(EpsilonGreedy):
    """Pure exploitation: EpsilonGreedy with epsilon = 0 (the Showdown's `RMS`).

    Its params are `EpsilonGreedyParams(epsilon=0.0)`; another epsilon is refused
    (ValueError), since a Greedy that explores would be an EpsilonGreedy misnamed.
    """

    name = "Greedy"
    default_params = EpsilonGreedyParams(epsilon=0.0)

    def _check_params(self, params: EpsilonGreedyParams | None) -> EpsilonGreedyParams:
        checked = super()._check_params(params)
        if checked.epsilon != 0.0:
            raise ValueError(
                f"epsilon must be 0 for Greedy (use EpsilonGreedy to explore), "
                f"got {checked.epsilon}"
            )
        return checked


class RofuPolicy(NeuralPolicy[RofuConfig]):
    """Regularised OFU (Zhou et al. 2021, Alg. 2) on the policy's own data buffer.

    Params: a `RofuConfig`. Defaults: the product preset's estimator and schedule
    (`rofu.models.presets.PRODUCT`). Decisions follow `rofu_decide` with the params' selection
    rule (`RofuConfig.rule`: argmax or igw, and the exploration floor), as the service's
    do: with no data yet the choice is uniform. The step (with a `stability_cap`) and, with
    the `ntk` estimator, the basis are prepared once per refit (per checkpoint, as the
    service does), from the rows held then; |D| and the arm counts stay current.
    """

    name = "ROFU"
    Params = RofuConfig
    default_params = PRODUCT.rofu
    default_schedule = PRODUCT.schedule

    def _setup(self, seed: int) -> None:
        self._prepared: PreparedModel | None = None  # the checkpoint's, until a refit
        self.family: LearnerFamily | None = None
        if self.schedule.family:
            net = require_mlp(self.net, "a learner family").config
            self.family = LearnerFamily(
                default_candidates(dataclasses.replace(net, standardise=False), self.schedule.fit),
                decay=self.schedule.fit.prequential_decay,
                persist=self.schedule.persist,
                device=self.device,
            )
            self.net = self.family.served_net

    def observe(self, batch: Transitions) -> None:
        """With a learner family, every candidate scores the rows (`LearnerFamily.observe`)
        and the served one's prequential loss is the buffer's noise."""
        if self.family is None:
            super().observe(batch)
            return
        self.family.observe(batch, self.arm_features)
        self.buffer.noise = self.family.losses[self.family.served]
        if self.family.served_net is not self.net:
            self.net, self._prepared = self.family.served_net, None

    @property
    def rofu(self) -> RofuConfig:
        """The estimator's hyper-parameters (`params`)."""
        return self.params

    @property
    def scoring_step(self) -> float | None:
        """The ascent step the current checkpoint scores with: `params.step_size`, or with
        a `stability_cap` the step it resolved to. None until a decision has resolved it
        (no data yet, or a refit since)."""
        return None if self._prepared is None else self._prepared.config.step_size

    def train(self) -> dict[str, float]:
        """Refit the network (every candidate's, with a family); a prepared NTK basis and
        step belong to the old weights."""
        self._prepared = None
        if self.family is None:
            return super().train()
        return self.family.fit(self.buffer.view(), self.fit_generator, self.arm_features)

    def scores(self, contexts: Tensor, candidates: Tensor | None = None) -> Scores:
        """ROFU's (B, A) scores from the checkpoint prepared at the first call since the
        last refit (`rofu.models.prepared`), with |D| and the arm counts current.

        Raises:
            ValueError: no data yet (nothing to regularise with), or bad inputs.
        """
        contexts, mask = self._prepare(contexts, candidates)
        if len(self.buffer) == 0:
            raise ValueError("ROFU needs at least one logged transition to score")
        return self._scores(contexts, mask)

    def _scores(self, contexts: Tensor, mask: Tensor) -> Scores:
        data = self.buffer.regulariser_data(self.n_arms)
        if self._prepared is None:
            self._prepared = prepare(
                self.net, data, self.rofu, self.generator, arm_features=self.arm_features
            )
        return score(self._prepared.with_data(data), contexts, self.generator, candidates=mask)

    def select(self, contexts: Tensor, candidates: Tensor | None = None) -> Decision:
        """ROFU's rule on the upper confidence bounds (`rofu_decide`); exact propensities."""
        contexts, mask = self._prepare(contexts, candidates)
        if len(self.buffer) == 0:
            return rofu_decide(None, mask, self.generator, rule=self.rofu.rule)
        scores = self._scores(contexts, mask)
        return rofu_decide(scores, mask, self.generator, rule=self.rofu.rule)
