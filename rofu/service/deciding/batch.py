"""The /select micro-batch handler: one batch of requests, one ROFU call, one write.

It runs in the batcher's worker thread, so a request costs the event loop no thread-pool
hop. Per batch: one query for the idempotency keys given, the catalogue (reloaded only
when stale), one ROFU call, and one transaction inserting every new decision. Each
request gets its own result or its own error: a failure fails only the requests that
needed the failed step.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlalchemy.exc import IntegrityError

from rofu.client.schemas import ArmExplanation
from rofu.service.api.schemas import SelectRequest
from rofu.service.db import repository
from rofu.service.db.engine import SessionFactory
from rofu.service.db.tables import DecisionRow
from rofu.service.deciding.apprentice import check_baseline, with_baseline
from rofu.service.deciding.catalogue import Arm, CatalogueCache
from rofu.service.deciding.explain import explanations
from rofu.service.deciding.holdout import with_holdout
from rofu.service.deciding.scoring import SelectJob, SelectOutcome
from rofu.service.errors import Conflict, InvalidInput


@dataclass(frozen=True)
class Pending:
    """One validated /select request, the digest of what defines it, and the vectors the
    model reads (`rofu.service.deciding.select.vectors`): its context, and per-request arm features
    by arm id."""

    body: SelectRequest
    digest: str
    context: tuple[float, ...]
    arm_features: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Decided:
    """The stored decision a request gets, whether this request created it, and, when it
    asked `explain` and created it from a model's scores, why each candidate scored so."""

    row: DecisionRow
    created: bool
    explanations: list[ArmExplanation] | None = None


Result = Decided | Exception  # an exception is that request's error, raised by its caller
ScoreJobs = Callable[[list[SelectJob]], list[SelectOutcome | None]]
Saved = tuple[DecisionRow, bool] | Exception  # (stored row, created) per event id


class DecisionBatch:
    """The micro-batcher's handler for /select.

    Args:
        scorer: scores a list of jobs (`rofu.service.deciding.scoring.Scorer`).
        sessions: the database.
        catalogue: the arm catalogue cache.
        on_scored: called with the number of jobs each ROFU call scores.
        apprentice: serve each request's `baseline_arm` (`rofu.service.deciding.apprentice`).
        hash_seed: `ROFU_FEATURE_HASH_SEED`, for the names in explanations.
        holdout: the holdout's (share, salt) (`rofu.service.deciding.holdout`).
    """

    def __init__(
        self,
        scorer: ScoreJobs,
        sessions: SessionFactory,
        catalogue: CatalogueCache,
        on_scored: Callable[[int], None] | None = None,
        *,
        apprentice: bool = False,
        hash_seed: int = 0,
        holdout: tuple[float, str] = (0.0, "holdout"),
    ) -> None:
        self._scorer = scorer
        self._sessions = sessions
        self._catalogue = catalogue
        self._on_scored = on_scored
        self._apprentice = apprentice
        self._hash_seed = hash_seed
        self._holdout_share, self._holdout_salt = holdout

    def __call__(self, batch: list[Pending]) -> list[Result]:
        """Decide every request of the batch: replay, refuse, or score and store."""
        results = self._replays(batch)
        jobs = self._jobs(batch, results)
        outcomes = self._score(jobs, results)
        rows = {i: self._decided(batch[i], jobs[i], outcome) for i, outcome in outcomes.items()}
        results.update(self._store(batch, rows))
        for i, outcome in outcomes.items():
            result = results[i]
            if outcome.gradients is not None and isinstance(result, Decided) and result.created:
                why = self._why(batch[i], jobs[i], outcome)
                results[i] = dataclasses.replace(result, explanations=why)
        return [results[i] for i in range(len(batch))]

    def _decided(self, pending: Pending, job: SelectJob, outcome: SelectOutcome) -> DecisionRow:
        """The row to store: rofu's decision, the baseline recorded (served in apprentice
        mode), and the control served to a holdout unit."""
        body = pending.body
        row = with_baseline(
            _row(pending, job, outcome), body.baseline_arm, job.candidates, serve=self._apprentice
        )
        return with_holdout(
            row,
            body.unit_id,
            job.candidates,
            share=self._holdout_share,
            salt=self._holdout_salt,
        )

    def _why(
        self, pending: Pending, job: SelectJob, outcome: SelectOutcome
    ) -> list[ArmExplanation]:
        """Each candidate's top contributions (`rofu.service.deciding.explain`)."""
        assert outcome.gradients is not None
        assert outcome.scored is not None
        context = pending.body.context
        return explanations(
            outcome.gradients,
            [(arm.slot, arm.id) for arm in job.candidates],
            outcome.scored,
            context if isinstance(context, dict) else None,
            self._hash_seed,
        )

    def _replays(self, batch: list[Pending]) -> dict[int, Result]:
        """The answers of requests whose key is already stored (one query)."""
        keyed = {i: p.body.event_id for i, p in enumerate(batch) if p.body.event_id is not None}
        if not keyed:
            return {}
        try:
            stored = repository.find_decisions(self._sessions, set(keyed.values()))
        except Exception as exc:  # only the keyed requests needed the lookup
            return dict.fromkeys(keyed, exc)
        return {
            i: _replay(stored[key], batch[i].digest) for i, key in keyed.items() if key in stored
        }

    def _jobs(self, batch: list[Pending], results: dict[int, Result]) -> dict[int, SelectJob]:
        """Jobs for the requests still open; a refused candidate set is that request's error."""
        waiting = [i for i in range(len(batch)) if i not in results]
        if not waiting:
            return {}
        try:
            catalogue = self._catalogue.fresh()
        except Exception as exc:
            results.update(dict.fromkeys(waiting, exc))
            return {}
        jobs = {}
        for i in waiting:
            pending = batch[i]
            body = pending.body
            try:
                candidates = catalogue.candidates(body.arms, body.exclude)
                check_baseline(body, candidates, apprentice=self._apprentice)
                own = _own_features(candidates, pending.arm_features)
            except InvalidInput as exc:
                results[i] = exc
                continue
            event_id = body.event_id or uuid.uuid4().hex  # the draw derives from it
            jobs[i] = SelectJob(
                event_id,
                pending.context,
                tuple(candidates),
                body.explore,
                arm_features=own,
                explain=body.explain,
            )
        return jobs

    def _score(
        self, jobs: dict[int, SelectJob], results: dict[int, Result]
    ) -> dict[int, SelectOutcome]:
        """One ROFU call for every job; a context whose scores are not finite is refused."""
        if not jobs:
            return {}
        if self._on_scored is not None:
            self._on_scored(len(jobs))
        try:
            outcomes = self._scorer(list(jobs.values()))
        except Exception as exc:
            results.update(dict.fromkeys(jobs, exc))
            return {}
        scored = {}
        for i, outcome in zip(jobs, outcomes, strict=True):
            if outcome is None:
                results[i] = InvalidInput(
                    "context: the model's scores for this context are not finite "
                    "(the served network overflows; pin an earlier version)",
                    field="context",
                )
            else:
                scored[i] = outcome
        return scored

    def _store(self, batch: list[Pending], rows: dict[int, DecisionRow]) -> dict[int, Result]:
        """Insert the new decisions; a second request with a key of this batch replays it."""
        first: dict[str, int] = {}
        for i, row in rows.items():
            first.setdefault(row.event_id, i)
        saved = self._insert([rows[i] for i in first.values()])
        results: dict[int, Result] = {}
        for i, row in rows.items():
            outcome = saved[row.event_id]
            if isinstance(outcome, Exception):
                results[i] = outcome
            elif outcome[1] and first[row.event_id] == i:
                results[i] = Decided(outcome[0], created=True)
            else:
                results[i] = _replay(outcome[0], batch[i].digest)
        return results

    def _insert(self, rows: list[DecisionRow]) -> dict[str, Saved]:
        """One transaction for every row; on a key stored meanwhile, row by row."""
        if not rows:
            return {}
        try:
            repository.insert_decisions(self._sessions, rows)
        except IntegrityError:  # a key won a race on another replica: settle each row alone
            return {row.event_id: self._save_one(row) for row in rows}
        except Exception as exc:  # the one transaction failed: every row in it did
            return dict.fromkeys((row.event_id for row in rows), exc)
        return {row.event_id: (row, True) for row in rows}

    def _save_one(self, row: DecisionRow) -> Saved:
        try:
            return repository.save_decision(self._sessions, row)
        except Exception as exc:
            return exc


def _replay(stored: DecisionRow, digest: str) -> Result:
    """The stored decision for a repeated key, or a 409 if the request differs."""
    if stored.request_hash != digest:
        return Conflict(
            f"event_id {stored.event_id!r} was already used for a different request",
            field="event_id",
        )
    return Decided(stored, created=False)


def _own_features(
    candidates: list[Arm], arm_features: Mapping[str, tuple[float, ...]]
) -> tuple[tuple[int, tuple[float, ...]], ...]:
    """Per-request arm features as (slot, features) pairs; every arm must be a candidate.

    Raises:
        InvalidInput: features for an arm that is not among the request's candidates.
    """
    slots = {arm.id: arm.slot for arm in candidates}
    for arm in arm_features:
        if arm not in slots:
            raise InvalidInput(
                f"arm_features.{arm}: {arm!r} is not a candidate of this request (unknown, "
                "retired, excluded or not in `arms`)",
                field=f"arm_features.{arm}",
            )
    return tuple((slots[arm], values) for arm, values in arm_features.items())


def _row(pending: Pending, job: SelectJob, outcome: SelectOutcome) -> DecisionRow:
    scores = [dataclasses.asdict(score) for score in outcome.scores]  # candidates' order
    body = pending.body
    return DecisionRow(
        event_id=job.event_id,
        context=list(job.context),
        candidates=[arm.id for arm in job.candidates],
        arm_id=outcome.arm.id,
        slot=outcome.arm.slot,
        propensity=outcome.propensity,
        probabilities=outcome.probabilities,
        model_version=outcome.model_version,
        explore=job.explore,
        policy=outcome.policy,
        scores=scores,
        request_hash=pending.digest,
        deferred=pending.body.defer,
        named_context=body.context if isinstance(body.context, dict) else None,
        arm_features={arm: list(values) for arm, values in pending.arm_features.items()} or None,
    )
