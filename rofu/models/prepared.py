"""One preparation of a checkpoint for scoring, for every caller.

A checkpoint (its network and regulariser data) is scored many times with the same
per-checkpoint work: the ascent step resolved under `RofuConfig.stability_cap`
(`rofu.models.rofu_stability`), the NTK basis (`rofu.models.rofu_ntk`) and, for the exact
estimator on a GPU, the CUDA graphs (`rofu.models.rofu_graphs`). `prepare` does that work
once and returns a `PreparedModel`; `score` is the one scoring path. The service's
snapshots, the replay's `RofuPolicy`, the benchmarks and `rofu evaluate` all go through
these two functions, so that what is timed and evaluated is what is served.

Preparing also resolves the reward's scale (`rofu.models.scaling`): sigma^2 under
`RofuConfig(noise="prequential")` into eta and l2, and a standardising network into its
plain g, its data in g's units and the `Standardiser` that `score` maps g's scores back with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from rofu.models.data import RegulariserData
from rofu.models.estimators import Basis, Kernel, get_estimator
from rofu.models.networks import RewardNet
from rofu.models.reward_model import RewardModel, evaluating
from rofu.models.rofu import checkpoint_inputs, rofu_scores
from rofu.models.rofu_config import CLOSED_FORMS, RofuConfig
from rofu.models.rofu_graphs import GraphedExact
from rofu.models.rofu_stability import resolve_step
from rofu.models.scaling import Standardiser, scoring_inputs
from rofu.models.scores import Scores


@dataclass(frozen=True)
class PreparedModel:
    """A checkpoint made ready to score, with everything `score` reads.

    Attributes:
        net: the reward network (its parameters are theta).
        data: the regulariser's data sample, on the network's device.
        config: the configuration it is scored with: the step resolved, no cap left.
        arm_features: (A, F) arm features on the network's device, or None.
        basis: the estimator's per-checkpoint basis (`ntk` and the closed forms), or None.
        graphs: the exact estimator's CUDA graphs, or None.
        standardiser: maps g's scores to the reward's scale (a standardising network's;
            `net` and `data` are then g and its data in g's units), or None.
    """

    net: RewardModel
    data: RegulariserData
    config: RofuConfig
    arm_features: Tensor | None = None
    basis: Basis | None = None
    graphs: GraphedExact | None = None
    standardiser: Standardiser | None = None

    def with_data(self, data: RegulariserData) -> PreparedModel:
        """The same preparation scoring with `data` (|D| and arm counts grown since; the
        basis, step and scale stay the checkpoint's). Graphs hold their own data: dropped."""
        if self.standardiser is not None:
            data = self.standardiser.data(data)
        return dataclasses.replace(self, data=data, graphs=None)

    def without_graphs(self) -> PreparedModel:
        """The same preparation scoring eagerly (a graph the driver refused)."""
        return dataclasses.replace(self, graphs=None)


def prepare(
    net: RewardModel,
    data: RegulariserData,
    config: RofuConfig,
    generator: torch.Generator,
    *,
    arm_features: Tensor | None = None,
    cuda_graphs: bool = False,
) -> PreparedModel:
    """Do a checkpoint's per-checkpoint work once.

    Args:
        net: the checkpoint's network, on the device it is scored on.
        data: its regulariser data (moved to the network's device).
        config: ROFU's hyper-parameters; a `stability_cap` is resolved here.
        generator: draws the NTK basis's minibatches (unused by `exact`).
        arm_features: (A, F) arm features of an arm-feature network.
        cuda_graphs: capture the exact estimator in CUDA graphs when the network is a
            `RewardNet` on a CUDA device and the setting is capturable.

    Returns:
        The `PreparedModel` that `score` scores with.

    Raises:
        ValueError, TypeError: on a bad argument, naming it.
    """
    estimator = get_estimator(config.estimator)
    net, data, config, standardiser = scoring_inputs(net, data, config)
    theta, arm_features = checkpoint_inputs(net, data, arm_features, None)
    device = next(iter(theta.values())).device
    data = data.with_sample(data.sample.to(device))
    if config.stability_cap is not None and config.estimator not in CLOSED_FORMS:
        config = resolve_step(net, data, config, theta, arm_features)
    with torch.no_grad(), evaluating(net):
        basis = estimator.prepare(net, theta, data, config, generator, arm_features)
    graphs = None
    if cuda_graphs and estimator.graphs and device.type == "cuda" and isinstance(net, RewardNet):
        try:
            graphs = GraphedExact(net, data, config, arm_features=arm_features)
        except ValueError:  # a setting it cannot capture (drift with l2): stay eager
            graphs = None
    return PreparedModel(net, data, config, arm_features, basis, graphs, standardiser)


def score(
    prepared: PreparedModel,
    contexts: Tensor,
    generator: torch.Generator,
    *,
    candidates: Tensor | None = None,
    pair_features: Tensor | None = None,
    kernel: Kernel = "fast",
) -> Scores:
    """Score B contexts with a prepared checkpoint: from its CUDA graphs when it has them
    (and no request brings its own arm features), else `rofu_scores` with its resolved
    configuration and basis.

    Args:
        prepared: from `prepare`.
        contexts: (B, *context_shape).
        generator: draws the exact estimator's minibatches for this call.
        candidates: (B, A) bool pairs to score; None scores every arm.
        pair_features: (B, A, F) per-request arm features (`rofu_scores`).
        kernel: the exact estimator's kernel (`rofu_scores`); `functional` skips graphs.

    Returns:
        Scores with (B, A) mean and bonus; NaN off the candidates.
    """
    standardiser = prepared.standardiser
    if standardiser is not None:
        contexts = standardiser.contexts(contexts)
    if prepared.graphs is not None and pair_features is None and kernel == "fast":
        scores = prepared.graphs(contexts, generator, candidates)
    else:
        scores = _eager(prepared, contexts, generator, candidates, pair_features, kernel)
    return scores if standardiser is None else standardiser.scores(scores)


def _eager(
    prepared: PreparedModel,
    contexts: Tensor,
    generator: torch.Generator,
    candidates: Tensor | None,
    pair_features: Tensor | None,
    kernel: Kernel,
) -> Scores:
    return rofu_scores(
        prepared.net,
        contexts,
        prepared.data,
        prepared.config,
        generator,
        candidates=candidates,
        arm_features=prepared.arm_features,
        pair_features=pair_features,
        basis=prepared.basis,
        kernel=kernel,
    )
