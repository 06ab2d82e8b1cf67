"""A learner the data chooses: candidate learners refitted on the same rows, the best served.

Each candidate (a network and how it is fitted) sees every new row first as a test: its
squared error (r_t - f_{theta_{t-1}}(x_t, a_t))^2 is folded into an exponentially weighted
mean (`rofu.models.data.Prequential`) before any refit trains on that row, so a row never
scores a model fitted on it. Every candidate is then refitted on the same rows, and the one
with the lowest prequential loss is served (ROFU's bonus is the served model's). A
candidate whose refit diverges, or whose predictions stop being finite, starts again from
its initial network (counted in `resets`), so one unstable learner never stops the family
from training or publishing. Training cost grows with the number of candidates.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rofu.models.checkpoint import CandidateState
from rofu.models.data import Prequential, Transitions
from rofu.models.networks import RewardNet, RewardNetConfig, parameters_finite
from rofu.models.scaling import squared_residuals
from rofu.models.training import FitConfig, fit, learner_net_config, make_optimizer
from rofu.models.validation import check_choice

log = logging.getLogger("rofu.learners")

#: The default family's candidates, in the order ties are broken.
LEARNERS = ("mlp", "sgd-decay", "linear")
#: The `sgd-decay` preset's fit: NeuralUCB's optimizer (rofu.models.presets).
SGD_DECAY_FIT = FitConfig(steps=10, batch_size=256, optimizer="sgd", lr=0.01, weight_decay=1e-3)


@dataclass(frozen=True)
class Candidate:
    """One candidate learner.

    Attributes:
        name: how the checkpoint, GET /v1/model and the metrics name it.
        net: its network.
        fit: how it is refitted.
    """

    name: str
    net: RewardNetConfig
    fit: FitConfig


def default_candidates(net: RewardNetConfig, fit_config: FitConfig) -> tuple[Candidate, ...]:
    """`mlp` (`net` with `fit_config`), `sgd-decay` (the same network, SGD with decay) and
    `linear` (no hidden layer, `fit_config`), each standardising as `fit_config` says."""
    return candidates(LEARNERS, net, fit_config)


def candidates(
    names: Sequence[str], net: RewardNetConfig, fit_config: FitConfig
) -> tuple[Candidate, ...]:
    """The named candidates of `LEARNERS`, in the order given (`default_candidates` says
    what each is).

    Raises:
        ValueError: an unknown or repeated name, or none.
    """
    if not names or len(set(names)) != len(names):
        raise ValueError(f"learners must name at least one candidate, each once, got {list(names)}")
    sgd = dataclasses.replace(
        SGD_DECAY_FIT,
        standardise=fit_config.standardise,
        prequential_decay=fit_config.prequential_decay,
    )
    built = {
        "mlp": Candidate("mlp", net, fit_config),
        "sgd-decay": Candidate("sgd-decay", net, sgd),
        "linear": Candidate("linear", dataclasses.replace(net, hidden=()), fit_config),
    }
    return tuple(built[check_choice("learner", name, LEARNERS)] for name in names)


class LearnerFamily:
    """Candidate learners kept side by side; `served` is the one with the lowest loss.

    Args:
        candidates: at least one, distinct names; ties go to the earliest.
        decay: d of each candidate's exponentially weighted prequential loss.
        persist: keep each candidate's optimizer across refits.
        device: where the networks live.
    """

    def __init__(
        self,
        candidates: Sequence[Candidate],
        *,
        decay: float = 0.999,
        persist: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        names = [c.name for c in candidates]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"candidates must have at least one and distinct names, got {names}")
        self.candidates = tuple(candidates)
        self.decay = decay
        self.persist = persist
        self.device = device
        self.nets = {c.name: self._initial_net(c) for c in self.candidates}
        self.losses = {c.name: Prequential() for c in self.candidates}
        self.resets = {c.name: 0 for c in self.candidates}
        self._optimizers: dict[str, torch.optim.Optimizer] = {}

    def _initial_net(self, candidate: Candidate) -> RewardNet:
        config = _as_mlp(learner_net_config(candidate.net, candidate.fit))
        return RewardNet(config).to(self.device).eval()

    @property
    def served(self) -> str:
        """The candidate with the lowest prequential loss (the first before any row)."""
        scored = [(self.losses[c.name].variance, i) for i, c in enumerate(self.candidates)]
        known = [(loss, i) for loss, i in scored if loss is not None]
        return self.candidates[min(known)[1] if known else 0].name

    @property
    def served_net(self) -> RewardNet:
        """The served candidate's network."""
        return self.nets[self.served]

    def observe(self, batch: Transitions, arm_features: Tensor | None) -> None:
        """Score new rows with every candidate as it is now, then fold them into the
        standardising candidates' statistics; call before any refit on them."""
        for candidate in self.candidates:
            net = self.nets[candidate.name]
            squared = squared_residuals(net, batch, arm_features)
            if not bool(torch.isfinite(squared).all()):
                net = self._reset(candidate, "its predictions are not finite")
            else:
                self.losses[candidate.name] = self.losses[candidate.name].updated(
                    squared, self.decay
                )
            first = next(net.parameters())
            net.observe(batch.x.to(first), batch.rewards.to(first))

    def fit(
        self, data: Transitions, generator: torch.Generator, arm_features: Tensor | None = None
    ) -> dict[str, float]:
        """Refit every candidate on `data`, each from the same minibatch draws; the served
        candidate's metrics, with every candidate's `loss/<name>` and `served` (its index)."""
        seed = int(torch.randint(2**62, (1,), generator=generator))
        metrics: dict[str, dict[str, float]] = {}
        for candidate in self.candidates:
            net = self.nets[candidate.name]
            optimizer = self._optimizer(candidate, net)
            draws = torch.Generator().manual_seed(seed)
            metrics[candidate.name] = fit(
                net, data, candidate.fit, draws, arm_features=arm_features, optimizer=optimizer
            )
            if not parameters_finite(net):
                self._reset(candidate, "its refit diverged")
        return metrics[self.served] | self.record()

    def _reset(self, candidate: Candidate, why: str) -> RewardNet:
        """Start a diverged candidate again: its initial network, a new optimizer, no loss
        (so it is not served before it has scored rows again); counted in `resets`."""
        log.warning("learner %r starts again: %s", candidate.name, why)
        self.nets[candidate.name] = net = self._initial_net(candidate)
        self.losses[candidate.name] = Prequential()
        self._optimizers.pop(candidate.name, None)
        self.resets[candidate.name] += 1
        return net

    def record(self) -> dict[str, float]:
        """`loss/<name>` per candidate with a loss yet, `resets/<name>` per candidate that
        diverged and started again, and `served`, the served index."""
        names = [c.name for c in self.candidates]
        losses = {f"loss/{n}": v for n in names if (v := self.losses[n].variance) is not None}
        resets = {f"resets/{n}": float(k) for n, k in self.resets.items() if k}
        return losses | resets | {"served": float(names.index(self.served))}

    def states(self) -> tuple[CandidateState, ...]:
        """Every candidate's network and loss, for a checkpoint."""
        return tuple(
            CandidateState(
                c.name,
                self.nets[c.name].config,
                {k: v.detach().cpu().clone() for k, v in self.nets[c.name].state_dict().items()},
                self.losses[c.name],
            )
            for c in self.candidates
        )

    def restore(self, states: Sequence[CandidateState]) -> list[str]:
        """Continue the candidates a checkpoint kept: each of `states` whose name and
        network configuration match one of this family's takes its parameters and loss
        (optimizers start afresh). Returns the names restored; the others start anew."""
        restored = []
        for kept in states:
            net = self.nets.get(kept.name)
            if net is None or kept.net_config != net.config:
                continue
            first = next(net.parameters())
            net.load_state_dict({k: v.to(first.device) for k, v in kept.state.items()})
            self.losses[kept.name] = kept.loss
            self._optimizers.pop(kept.name, None)
            restored.append(kept.name)
        return restored

    def all_finite(self) -> bool:
        """Whether every candidate's parameters are finite (a diverged one is never kept)."""
        return all(parameters_finite(net) for net in self.nets.values())

    def _optimizer(self, candidate: Candidate, net: RewardNet) -> torch.optim.Optimizer | None:
        if not self.persist:
            return None
        if candidate.name not in self._optimizers:
            self._optimizers[candidate.name] = make_optimizer(net, candidate.fit)
        return self._optimizers[candidate.name]


def _as_mlp(config: object) -> RewardNetConfig:
    if not isinstance(config, RewardNetConfig):
        raise TypeError(f"a candidate's network must be a RewardNetConfig, got {config!r}")
    return config
