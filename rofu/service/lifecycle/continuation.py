"""What a training run continues: the previous checkpoint's network and, with fit_persist,
the optimizer this process kept; or, with a learner family (`ROFU_LEARNERS`,
`rofu.models.learners`), its candidates, and one run's prequential scoring and refit of
them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from rofu.models import Checkpoint, DataBuffer, FitConfig, RewardNet
from rofu.models.checkpoint import CandidateState
from rofu.models.data import Prequential, Transitions
from rofu.models.learners import LearnerFamily, candidates
from rofu.models.training import make_optimizer
from rofu.service.settings import Settings


@dataclass(frozen=True)
class KeptNetwork:
    """The network and optimizer of the checkpoint this trainer published last."""

    version: int
    net: RewardNet
    optimizer: torch.optim.Optimizer
    config: FitConfig  # its FitConfig, steps aside: another one starts a fresh optimizer


def continued_network(
    settings: Settings, previous: Checkpoint | None, config: FitConfig, kept: KeptNetwork | None
) -> tuple[RewardNet, torch.optim.Optimizer | None]:
    """The network to refit and, with fit_persist, the optimizer it continues.

    The optimizer carries over while this process continues from the checkpoint it
    published last (`kept`, its network in memory); after a restart, a failed run or
    another trainer's checkpoint a fresh one starts, as at the first.
    """
    if not settings.fit_persist:
        return _network(settings, previous, config), None
    if (
        kept is not None
        and previous is not None
        and kept.version == previous.version
        and kept.config == dataclasses.replace(config, steps=0)
    ):
        return kept.net, kept.optimizer
    net = _network(settings, previous, config)
    return net, make_optimizer(net, config)


def _network(settings: Settings, previous: Checkpoint | None, config: FitConfig) -> RewardNet:
    """The previous checkpoint's network (a fresh one without), standardising as
    `config.standardise` says: switching keeps the layers, and a newly standardising
    network starts its statistics at the new rows."""
    if previous is None:
        return RewardNet(dataclasses.replace(settings.net_config(), standardise=config.standardise))
    net = previous.network()
    if net.config.standardise != config.standardise:
        switched = RewardNet(dataclasses.replace(net.config, standardise=config.standardise))
        layers = {k: v for k, v in net.state_dict().items() if k.startswith("layers.")}
        switched.load_state_dict(layers, strict=False)
        return switched
    return net


@dataclass(frozen=True)
class KeptFamily:
    """The family of the checkpoint this trainer published last."""

    version: int
    config: FitConfig  # its FitConfig, steps aside: another one starts a fresh family
    family: LearnerFamily


def continued_family(
    settings: Settings, previous: Checkpoint | None, config: FitConfig, kept: KeptFamily | None
) -> LearnerFamily:
    """The candidate learners a run refits, each taking the run's steps: `kept` while this
    process continues the checkpoint it published last (with fit_persist, their optimizers
    too), else a family continuing the candidates the previous checkpoint kept. From a
    checkpoint without a family, `mlp` continues its network and its loss; a candidate it
    did not keep starts anew."""
    steps0 = dataclasses.replace(config, steps=0)
    if (
        kept is not None
        and previous is not None
        and (kept.version, kept.config)
        == (
            previous.version,
            steps0,
        )
    ):
        family = kept.family
    else:
        family = LearnerFamily(
            candidates(settings.learners, settings.net_config(), config),
            decay=config.prequential_decay,
            persist=settings.fit_persist,
        )
        if previous is not None:
            family.restore(previous.candidates or (_as_candidate(previous),))
    family.candidates = tuple(
        dataclasses.replace(c, fit=dataclasses.replace(c.fit, steps=config.steps))
        for c in family.candidates
    )
    return family


def refit_family(
    family: LearnerFamily,
    buffer: DataBuffer,
    new: Transitions,
    generator: torch.Generator,
    features: torch.Tensor | None,
) -> dict[str, float]:
    """Every candidate scores the new rows, then is refitted on the buffer with them; the
    served candidate's loss is the buffer's prequential noise. Returns the fit's metrics."""
    family.observe(new, features)
    buffer.noise = family.losses[family.served]
    buffer.append(new)
    return family.fit(buffer.view(), generator, features)


def _as_candidate(previous: Checkpoint) -> CandidateState:
    """A checkpoint made without a family as the `mlp` candidate: its network, and its
    prequential noise as the loss so far."""
    return CandidateState(
        "mlp", previous.net_config, previous.state, previous.data.noise or Prequential()
    )
