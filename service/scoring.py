"""Scoring a micro-batch of /select requests with ROFU from the served snapshot."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models import RofuConfig, Scores, rofu_scores
from models.policies.base import greedy_decision, uniform_decision
from service.catalogue import Arm, CatalogueCache
from service.snapshot import SnapshotHolder

COLD_START = "cold-start"
ROFU = "rofu"


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
    ) -> None:
        self._holder = holder
        self._catalogue = catalogue
        self._config = config
        self._arm_feature_dim = arm_feature_dim
        self._generator = torch.Generator().manual_seed(seed)

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
        scores = rofu_scores(
            snapshot.net,
            contexts.to(device),
            snapshot.data,
            self._config,
            self._generator,
            candidates=mask,
            arm_features=features,
        )
        mean, bonus = scores.mean.cpu().double(), scores.bonus.cpu().double()
        finite = (torch.isfinite(mean) & torch.isfinite(bonus)) | ~mask
        return [
            self._choose(job, mean[row], bonus[row], mask[row], snapshot.version)
            if bool(finite[row].all())
            else None
            for row, job in enumerate(jobs)
        ]

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
