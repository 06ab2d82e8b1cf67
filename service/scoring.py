"""Scoring a micro-batch of /select requests with ROFU from the served snapshot."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from models import RofuConfig, Scores, rofu_scores
from models.policies.base import greedy_decision, uniform_decision
from models.rofu import NtkBasis, ntk_basis
from models.rofu_graphs import GraphedExact
from service.catalogue import Arm, CatalogueCache
from service.snapshot import Snapshot, SnapshotHolder

log = logging.getLogger("rofu.scoring")

COLD_START = "cold-start"
ROFU = "rofu"


def checkpoint_generator(seed: int, version: int) -> torch.Generator:
    """The generator a checkpoint's NTK basis draws its minibatches from: the same for
    every replica serving that version."""
    return torch.Generator().manual_seed(seed * 1_000_003 + version)


@dataclass(frozen=True)
class SelectJob:
    """One validated /select request."""

    context: tuple[float, ...]
    candidates: tuple[Arm, ...]
    explore: bool


@dataclass(frozen=True)
class ArmScores:
    """Per candidate arm: mean, bonus and ucb = mean + bonus."""

    mean: float
    bonus: float
    ucb: float


@dataclass(frozen=True)
class SelectOutcome:
    """The choice for one job and what it was made from."""

    arm: Arm
    propensity: float
    model_version: int
    policy: str
    scores: dict[str, ArmScores] | None  # None on a cold start


class Scorer:
    """One ROFU call for every job of a batch (called by `DecisionBatch`, off the loop)."""

    def __init__(
        self,
        holder: SnapshotHolder,
        catalogue: CatalogueCache,
        config: RofuConfig,
        arm_feature_dim: int,
        seed: int,
        *,
        cuda_graphs: bool = True,
    ) -> None:
        self._holder = holder
        self._catalogue = catalogue
        self._config = config
        self._arm_feature_dim = arm_feature_dim
        self._seed = seed
        self._generator = torch.Generator().manual_seed(seed)
        self._cuda_graphs = cuda_graphs
        # Built once per checkpoint and arm feature table: the NTK basis, or CUDA graphs.
        self._cache: tuple[tuple[str, bytes] | None, object | None] = (None, None)

    def __call__(self, jobs: list[SelectJob]) -> list[SelectOutcome | None]:
        """Score and choose for every job (runs in the batcher's worker thread).

        None for a job whose candidates' scores are not finite (a context so far out of
        range that the network overflows): it cannot be decided, and must not be logged.
        """
        snapshot = self._holder.current  # one snapshot for the whole batch
        if snapshot is None:
            return [self._cold_start(job) for job in jobs]
        catalogue = self._catalogue.current  # at least as new as the jobs' candidates
        n_slots = snapshot.net.config.n_arms or catalogue.n_slots
        device = next(snapshot.net.parameters()).device
        mask = torch.zeros(len(jobs), n_slots, dtype=torch.bool)
        for row, job in enumerate(jobs):
            mask[row, [arm.slot for arm in job.candidates]] = True
        features = None
        if self._arm_feature_dim:
            features = catalogue.feature_table(self._arm_feature_dim).to(device)
        contexts = torch.tensor([job.context for job in jobs], dtype=torch.float32)
        scores = self._scores(snapshot, contexts.to(device), mask, features)
        mean, bonus = scores.mean.cpu().double(), scores.bonus.cpu().double()
        finite = (torch.isfinite(mean) & torch.isfinite(bonus)) | ~mask
        return [
            self._choose(job, mean[row], bonus[row], mask[row], snapshot.version)
            if bool(finite[row].all())
            else None
            for row, job in enumerate(jobs)
        ]

    def _scores(
        self,
        snapshot: Snapshot,
        contexts: torch.Tensor,
        mask: torch.Tensor,
        features: torch.Tensor | None,
    ) -> Scores:
        graphed = self._graphed(snapshot, features)
        if graphed is not None:
            try:
                return graphed(contexts, self._generator, mask)
            except RuntimeError:  # e.g. a capture the driver refuses: stay eager for it
                log.warning("CUDA graph replay failed; scoring eagerly", exc_info=True)
                self._cache = (self._cache[0], None)
        return rofu_scores(
            snapshot.net,
            contexts,
            snapshot.data,
            self._config,
            self._generator,
            candidates=mask,
            arm_features=features,
            basis=self.basis(snapshot, features),
        )

    def _cached(self, snapshot: Snapshot, features: torch.Tensor | None) -> object | None:
        """What was built for this checkpoint and arm feature table, if anything."""
        table = b"" if features is None else features.cpu().numpy().tobytes()
        key = (snapshot.checksum, table)
        if self._cache[0] != key:
            self._cache = (key, self._build(snapshot, features))
        return self._cache[1]

    def _build(self, snapshot: Snapshot, features: torch.Tensor | None) -> object | None:
        on_cuda = next(snapshot.net.parameters()).device.type == "cuda"
        config = self._config
        if config.estimator == "ntk":
            # Minibatches from a generator seeded by the version: every replica serving a
            # version holds the same basis.
            generator = checkpoint_generator(self._seed, snapshot.version)
            return ntk_basis(snapshot.net, snapshot.data, config, generator, arm_features=features)
        if on_cuda and self._cuda_graphs:
            try:
                return GraphedExact(snapshot.net, snapshot.data, config, arm_features=features)
            except ValueError:  # a setting it cannot capture (drift with l2): stay eager
                return None
        return None

    def basis(self, snapshot: Snapshot, features: torch.Tensor | None) -> NtkBasis | None:
        """The `ntk` estimator's basis for this checkpoint (and arm features), built once."""
        built = self._cached(snapshot, features)
        return built if isinstance(built, NtkBasis) else None

    def _graphed(self, snapshot: Snapshot, features: torch.Tensor | None) -> GraphedExact | None:
        built = self._cached(snapshot, features)
        return built if isinstance(built, GraphedExact) else None

    def _choose(
        self,
        job: SelectJob,
        mean: torch.Tensor,
        bonus: torch.Tensor,
        mask: torch.Tensor,
        version: int,
    ) -> SelectOutcome:
        by_slot = {arm.slot: arm for arm in job.candidates}
        used_bonus = bonus if job.explore else torch.zeros_like(bonus)
        decision = greedy_decision(
            Scores(mean[None], used_bonus[None]), mask[None], self._generator
        )
        per_arm = {
            arm.id: ArmScores(
                float(mean[arm.slot]),
                float(bonus[arm.slot]),
                float(mean[arm.slot] + bonus[arm.slot]),
            )
            for arm in job.candidates
        }
        return SelectOutcome(
            arm=by_slot[int(decision.arms[0])],
            propensity=float(decision.propensity[0]),
            model_version=version,
            policy=ROFU,
            scores=per_arm,
        )

    def _cold_start(self, job: SelectJob) -> SelectOutcome:
        """No checkpoint yet: a uniform choice, its propensity logged."""
        mask = torch.ones(1, len(job.candidates), dtype=torch.bool)
        zeros = torch.zeros(1, len(job.candidates))
        decision = uniform_decision(Scores(zeros, zeros), mask, self._generator)
        return SelectOutcome(
            arm=job.candidates[int(decision.arms[0])],
            propensity=float(decision.propensity[0]),
            model_version=0,
            policy=COLD_START,
            scores=None,
        )
