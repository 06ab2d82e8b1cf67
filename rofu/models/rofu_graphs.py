"""The exact estimator captured in CUDA graphs: one graph per batch-size bucket.

On a GPU, one context per call leaves exact ROFU launch-bound: hundreds of small kernels,
each launched from Python, while the arithmetic takes microseconds. `GraphedExact`
captures the whole estimator (rows, M steps, both trajectories, the bonus) for a batch
of `bucket` contexts x every arm into a `torch.cuda.CUDAGraph`, once per bucket (1, 2, 4,
... 64), and replays it: a call copies its contexts, minibatch indices and weights into
the graph's static inputs, pads to the bucket, replays, and masks non-candidates.

Without CUDA (or with `capture=False`) the same static-buffer path runs eagerly, so the
padding, bucketing and masking are tested on a CPU. Results equal `rofu_scores` with the
same generator: the minibatches are drawn on the host exactly as it draws them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rofu.models.data import RegulariserData
from rofu.models.networks import RewardNet
from rofu.models.rofu_config import RofuConfig, minibatch_indices, regulariser_weights
from rofu.models.rofu_exact import ExactAscent
from rofu.models.scores import Scores

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class _Static:
    """A graph's fixed input and output buffers for `bucket` contexts x A arms."""

    contexts: Tensor  # (bucket, D)
    steps: Tensor | None  # (M, m) minibatch rows, or None for the whole sample
    weights: Tensor  # (bucket * A,)
    mean: Tensor  # (bucket, A)
    bonus: Tensor  # (bucket, A)


class GraphedExact:
    """Exact ROFU for one checkpoint (network, data, arm features), replayed from graphs.

    Args:
        net: the served network (its parameters are read in place by the graphs).
        data: the checkpoint's regulariser data.
        config: ROFU settings; `exact` only, and with `drift` only without l2 (whose
            per-weight grouping is data-dependent, so not capturable).
        arm_features: (A, F) for an arm-feature network.
        capture: capture CUDA graphs; default: when the network is on a CUDA device.
        buckets: the batch sizes graphs are captured for; larger batches are split.
    """

    def __init__(
        self,
        net: RewardNet,
        data: RegulariserData,
        config: RofuConfig,
        *,
        arm_features: Tensor | None = None,
        capture: bool | None = None,
        buckets: tuple[int, ...] = BUCKETS,
    ) -> None:
        if config.estimator != "exact":
            raise ValueError("GraphedExact runs the exact estimator only")
        if config.baseline == "drift" and config.l2 > 0:
            raise ValueError("GraphedExact cannot capture the drift baseline with l2 > 0")
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            raise ValueError("buckets must be increasing positive batch sizes")
        first = next(net.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError("capture needs the network on a CUDA device")
        self.net, self.data, self.config, self.buckets = net, data, config, buckets
        self.arm_features = None if arm_features is None else arm_features.to(first)
        self.n_arms = net.arm_count(self.arm_features)
        self.sample = data.sample.to(self.device, self.dtype)
        self.theta = {name: p.detach() for name, p in net.named_parameters()}
        self._arms = torch.arange(self.n_arms, device=self.device)
        self._static: dict[int, _Static] = {}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def __call__(
        self, contexts: Tensor, generator: torch.Generator, candidates: Tensor | None = None
    ) -> Scores:
        """Score (B, D) contexts; NaN where `candidates` (B, A) is False.

        The minibatches are drawn once per call, so every pair of the call shares them
        (as `rofu_scores`), however many buckets the batch spans.
        """
        steps = minibatch_indices(len(self.sample), self.config, generator)
        means, bonuses = [], []
        for start in range(0, contexts.shape[0], self.buckets[-1]):
            chunk = contexts[start : start + self.buckets[-1]]
            mean, bonus = self._run(chunk, steps)
            means.append(mean)
            bonuses.append(bonus)
        mean, bonus = torch.cat(means), torch.cat(bonuses)
        if candidates is not None:
            keep = candidates.to(self.device)
            mean = mean.masked_fill(~keep, float("nan"))
            bonus = bonus.masked_fill(~keep, float("nan"))
        return Scores(mean=mean, bonus=bonus)

    def bucket(self, batch: int) -> int:
        """The smallest bucket that holds `batch` contexts."""
        return next(b for b in self.buckets if b >= batch)

    def _run(self, contexts: Tensor, steps: Tensor | None) -> tuple[Tensor, Tensor]:
        batch = contexts.shape[0]
        bucket = self.bucket(batch)
        static = self._static.get(bucket) or self._prepare(bucket)
        static.contexts[:batch].copy_(contexts)
        static.contexts[batch:].zero_()  # padding rows: scored, then dropped
        if static.steps is not None and steps is not None:
            static.steps.copy_(steps)
        if bucket in self._graphs:
            self._graphs[bucket].replay()
        else:
            self._compute(static)
        return static.mean[:batch].clone(), static.bonus[:batch].clone()

    def _prepare(self, bucket: int) -> _Static:
        pairs = torch.arange(self.n_arms).repeat(bucket)
        weights = regulariser_weights(self.data, pairs, self.config)
        steps = minibatch_indices(len(self.sample), self.config, torch.Generator())
        static = _Static(
            contexts=torch.zeros(
                bucket, self.net.config.context_dim, device=self.device, dtype=self.dtype
            ),
            steps=None if steps is None else steps.to(self.device),
            weights=weights.to(self.device, self.dtype),
            mean=torch.zeros(bucket, self.n_arms, device=self.device, dtype=self.dtype),
            bonus=torch.zeros(bucket, self.n_arms, device=self.device, dtype=self.dtype),
        )
        self._static[bucket] = static
        if self.capture:
            self._graphs[bucket] = self._captured(static)
        return static

    def _captured(self, static: _Static) -> torch.cuda.CUDAGraph:
        """Warm up on a side stream (as torch.cuda.graph requires), then capture."""
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._compute(static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._compute(static)
        return graph

    def _compute(self, static: _Static) -> None:
        """The whole estimator from the static inputs into the static outputs."""
        bucket = static.contexts.shape[0]
        ascent = ExactAscent(self.net, self.sample, self.arm_features, self.config, static.steps)
        x = static.contexts.repeat_interleave(self.n_arms, dim=0)  # (bucket * A, D)
        arms = self._arms.repeat(bucket)  # (bucket * A,)
        f0, gain = ascent.ascend(self.theta, x, arms, static.weights)
        static.mean.copy_(f0.view(bucket, self.n_arms))
        bonus = self.config.bonus_scale * gain.clamp(min=0).sqrt()
        static.bonus.copy_(bonus.view(bucket, self.n_arms))
