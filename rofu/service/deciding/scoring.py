"""Scoring a micro-batch of /select requests with ROFU from the served snapshot.

A request's scores depend only on the served version, its candidates (with their
features: the catalogue's, or the request's own) and its context:
every random number of the estimator (the regulariser's minibatches) comes from the
checkpoint's own generator, drawn afresh for every call, so batch mates and earlier
calls change nothing: bit for bit on a CPU, and with NTK-ROFU on a GPU. The exact
estimator on a GPU replays one CUDA graph per batch-size bucket, and cuBLAS picks its
kernels by shape, so there batch mates can move a score in its last float32 bits (4e-6
relative, measured on an H100; `benchmarks/RESULTS.md`). The choice is random only where
the selection rule says so (ties, the exploration floor, inverse-gap weighting), and its
draw is one uniform number per event, derived from the seed and the event id
(`event_uniform`): the logged probabilities are exactly those the draw used, and the draw
can be recomputed from the log.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass

import torch

from rofu.models import RofuConfig, Scores
from rofu.models.policies.base import rofu_decide
from rofu.models.prepared import PreparedModel, prepare, score
from rofu.models.scores import ArmScore, Decision
from rofu.service.deciding.catalogue import Arm, CatalogueCache
from rofu.service.deciding.explain import mean_gradients
from rofu.service.deciding.snapshot import Snapshot, SnapshotHolder

log = logging.getLogger("rofu.scoring")

COLD_START = "cold-start"
ROFU = "rofu"


def checkpoint_generator(seed: int, version: int) -> torch.Generator:
    """A fresh generator for a checkpoint's minibatches (the NTK basis's, or each exact
    call's): the same for every call and every replica serving that version."""
    return torch.Generator().manual_seed(seed * 1_000_003 + version)


def prepare_served(
    snapshot: Snapshot,
    config: RofuConfig,
    seed: int,
    *,
    arm_features: torch.Tensor | None = None,
    cuda_graphs: bool = False,
) -> PreparedModel:
    """The served checkpoint prepared for scoring (`rofu.models.prepared.prepare`) as every
    replica prepares it: the NTK basis's minibatches from `checkpoint_generator`, so that
    every replica serving a version holds the same basis. `rofu evaluate` and
    `rofu bench load` prepare through here too."""
    generator = checkpoint_generator(seed, snapshot.version)
    return prepare(
        snapshot.net,
        snapshot.data,
        config,
        generator,
        arm_features=arm_features,
        cuda_graphs=cuda_graphs,
    )


def _per_request(jobs: list[SelectJob], features: torch.Tensor | None) -> torch.Tensor | None:
    """(B, slots, F) arm features by job: the catalogue's, with each job's own in place;
    None when no job has its own (or the network reads no arm features)."""
    if features is None or not any(job.arm_features for job in jobs):
        return None
    table = features.expand(len(jobs), *features.shape).clone()  # (B, slots, F)
    for row, job in enumerate(jobs):
        for slot, values in job.arm_features:
            table[row, slot] = torch.tensor(values, dtype=table.dtype)
    return table


def event_uniform(seed: int, event_id: str) -> float:
    """The uniform number in [0, 1) that draws the arm of event `event_id`: 53 bits of
    SHA-256(seed, event id), so distinct events draw independently of each other, of
    their batch mates and of the replica."""
    digest = hashlib.sha256(f"{seed}:{event_id}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / 2.0**53


@dataclass(frozen=True)
class SelectJob:
    """One validated /select request, with the event id its decision is stored under.

    `arm_features`: (slot, features) of the candidates given per-request arm features,
    which replace the catalogue's for this job (arm-feature networks only).
    """

    event_id: str
    context: tuple[float, ...]
    candidates: tuple[Arm, ...]
    explore: bool
    arm_features: tuple[tuple[int, tuple[float, ...]], ...] = ()
    explain: bool = False


@dataclass(frozen=True)
class SelectOutcome:
    """The choice for one job and what it was made from."""

    arm: Arm
    propensity: float  # probabilities[arm's position]
    model_version: int
    policy: str
    scores: list[ArmScore]  # per candidate, in the job's order (unscored on a cold start)
    probabilities: list[float]  # per candidate, in the job's order; they sum to 1
    # For a job with `explain`, scored by a model: d mean / d x per output slot (A, D), at
    # `scored`, the context as scored (`rofu.service.deciding.explain`).
    gradients: torch.Tensor | None = None
    scored: tuple[float, ...] | None = None


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
        self._cuda_graphs = cuda_graphs
        # Built once per checkpoint and arm feature table (`prepared`).
        self._cache: tuple[tuple[str, bytes] | None, PreparedModel | None] = (None, None)

    def __call__(self, jobs: list[SelectJob]) -> list[SelectOutcome | None]:
        """Score and choose for every job (runs in the batcher's worker thread).

        Contexts, and per-request arm features, are scored clamped into the range the
        network was trained on (`Snapshot.bounded`, `Snapshot.bounded_features`). None for
        a job whose candidates' scores are still not finite (a network that overflows on
        its own data's range): it cannot be decided, and must not be logged.
        """
        snapshot = self._holder.current  # one snapshot for the whole batch
        catalogue = self._catalogue.current  # at least as new as the jobs' candidates
        n_slots = catalogue.n_slots if snapshot is None else snapshot.net.config.n_arms
        mask = torch.zeros(len(jobs), n_slots or catalogue.n_slots, dtype=torch.bool)
        for row, job in enumerate(jobs):
            mask[row, [arm.slot for arm in job.candidates]] = True
        uniforms = torch.tensor([event_uniform(self._seed, job.event_id) for job in jobs])
        rule = self._config.rule
        if snapshot is None:
            decision = rofu_decide(None, mask, None, rule=rule, uniforms=uniforms)
            return [self._outcome(job, decision, row, None, 0) for row, job in enumerate(jobs)]
        device = next(snapshot.net.parameters()).device
        features = None
        if self._arm_feature_dim:
            features = catalogue.feature_table(self._arm_feature_dim).to(device)
        contexts = torch.tensor([job.context for job in jobs], dtype=torch.float32)
        bounded = snapshot.bounded(contexts.to(device))  # into the range the network knows
        pair = _per_request(jobs, features)
        if pair is not None and features is not None:  # and into the range it knows
            pair = snapshot.bounded_features(pair, features)
        raw = self._scores(snapshot, bounded, mask, features, pair)
        scores = Scores(raw.mean.cpu().double(), raw.bonus.cpu().double())
        finite = ((torch.isfinite(scores.mean) & torch.isfinite(scores.bonus)) | ~mask).all(1)
        explore = torch.tensor([job.explore for job in jobs])
        decision = rofu_decide(scores, mask, None, explore=explore, rule=rule, uniforms=uniforms)
        outcomes = [
            self._outcome(job, decision, row, scores, snapshot.version)
            if bool(finite[row])
            else None
            for row, job in enumerate(jobs)
        ]
        return _explained(outcomes, jobs, snapshot, bounded, features, pair)

    def _scores(
        self,
        snapshot: Snapshot,
        contexts: torch.Tensor,
        mask: torch.Tensor,
        features: torch.Tensor | None,
        pair_features: torch.Tensor | None,
    ) -> Scores:
        """Scores from the checkpoint prepared once (`prepared`): from its CUDA graphs when
        built and no job has its own arm features, else eagerly."""
        prepared = self.prepared(snapshot, features)
        generator = checkpoint_generator(self._seed, snapshot.version)  # used by `exact`
        if prepared.graphs is not None and pair_features is None:
            try:
                return score(prepared, contexts, generator, candidates=mask)
            except RuntimeError:  # e.g. a capture the driver refuses: stay eager for it
                log.warning("CUDA graph replay failed; scoring eagerly", exc_info=True)
                prepared = prepared.without_graphs()
                self._cache = (self._cache[0], prepared)
        return score(prepared, contexts, generator, candidates=mask, pair_features=pair_features)

    def prepared(self, snapshot: Snapshot, features: torch.Tensor | None) -> PreparedModel:
        """This checkpoint and arm feature table prepared for scoring (`prepare_served`),
        built once: the step it runs (a stability_cap resolved), the NTK basis or the
        CUDA graphs."""
        table = b"" if features is None else features.cpu().numpy().tobytes()
        key = (snapshot.checksum, table)
        prepared = self._cache[1]
        if self._cache[0] != key or prepared is None:
            prepared = prepare_served(
                snapshot,
                self._config,
                self._seed,
                arm_features=features,
                cuda_graphs=self._cuda_graphs,
            )
            self._cache = (key, prepared)
        return prepared

    def _outcome(
        self,
        job: SelectJob,
        decision: Decision,
        row: int,
        scores: Scores | None,
        version: int,
    ) -> SelectOutcome:
        """Job `row`'s choice; scores None on a cold start."""
        by_slot = {arm.slot: arm for arm in job.candidates}
        slots = [(arm.slot, arm.id) for arm in job.candidates]
        assert decision.probabilities is not None  # rofu_decide computes them
        probabilities = decision.probabilities[row].tolist()
        return SelectOutcome(
            arm=by_slot[int(decision.arms[row])],
            propensity=float(decision.propensity[row]),
            model_version=version,
            policy=COLD_START if scores is None else ROFU,
            scores=[ArmScore.unscored(arm) for _, arm in slots]
            if scores is None
            else scores.per_arm(row, slots),
            probabilities=[probabilities[slot] for slot, _ in slots],
        )


def _explained(
    outcomes: list[SelectOutcome | None],
    jobs: list[SelectJob],
    snapshot: Snapshot,
    contexts: torch.Tensor,
    features: torch.Tensor | None,
    pair: torch.Tensor | None,
) -> list[SelectOutcome | None]:
    """The outcomes, those of jobs asking `explain` with their mean's gradients."""
    rows = [row for row, job in enumerate(jobs) if job.explain and outcomes[row] is not None]
    if not rows:
        return outcomes
    tables = [features if pair is None else pair[row] for row in rows]
    chosen = contexts[rows]
    gradients = mean_gradients(snapshot.net, chosen, tables).cpu()  # (J, A, D)
    scored = chosen.cpu().double()
    for k, row in enumerate(rows):
        outcome = outcomes[row]
        assert outcome is not None
        outcomes[row] = dataclasses.replace(
            outcome, gradients=gradients[k], scored=tuple(scored[k].tolist())
        )
    return outcomes
