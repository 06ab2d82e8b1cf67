"""The service's own decision log as arrays, and a stored checkpoint's scores on it.

`read_service_log` reads the rewarded decisions through the export reader
(`rofu.service.log.pages`), leaving out deferred decisions not activated in time (their
choice may not have been shown, so they say nothing of any policy's value), with when
each was made and which checkpoint's training consumed it (`rofu.service.log.fresh`
tells from these which rows a checkpoint has not seen); `checkpoint_scores` scores the
logged contexts with a stored checkpoint exactly as the service would have: the same
network, ROFU configuration, clamping and per-version generator.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import torch
from sqlalchemy import select

from rofu.client.records import DecisionRecord
from rofu.models import RofuConfig
from rofu.models.checkpoint import CheckpointError
from rofu.models.prepared import score
from rofu.service.db.engine import SessionFactory
from rofu.service.db.repository import database_errors
from rofu.service.db.tables import HOLDOUT, DecisionRow
from rofu.service.deciding.apprentice import APPRENTICE
from rofu.service.deciding.catalogue import Catalogue, CatalogueCache
from rofu.service.deciding.scoring import checkpoint_generator, prepare_served
from rofu.service.deciding.snapshot import Snapshot, load_served
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.log.imports.rows import IMPORTED
from rofu.service.log.pages import EVERYTHING, Window, iter_decisions
from rofu.service.log.record import rule_probabilities
from rofu.service.settings import Settings


class EvaluationError(ValueError):
    """The log or a checkpoint cannot be evaluated (no rows, unknown version, ...)."""


@dataclass(frozen=True)
class ServiceLog:
    """The rewarded decisions, oldest first. N rows, S catalogue slots.

    Attributes:
        contexts: (N, D) as logged.
        candidates: (N, S) bool, the arms each decision chose among.
        actions: (N,) the chosen arm's slot.
        propensities: (N,) the chosen arm's logged probability.
        logging: (N, S) the logging rule's probability of each slot (0 off the
            candidates); NaN rows where only the propensity was logged.
        rewards: (N,) the reward (or the default reward).
        explore: (N,) bool, whether the request let the service explore.
        versions: (N,) the model version that decided.
        catalogue: the arm catalogue (slot -> arm).
        unrewarded: decisions left out for lack of a reward.
        baselines: (N,) the slot of the app's `baseline_arm`, -1 where none was sent.
        served_baseline: (N,) bool, apprentice mode served the baseline (probability 1).
        rule: (N, S) rofu's own rule's probabilities: those it served by, or on an
            apprentice row those it would have (0 off the candidates; NaN rows where
            not logged).
        unactivated: deferred decisions left out for want of an activation in time.
        arm_features: per row, the request's own arm features (arm id -> features) that
            replaced the catalogue's, or None (an arm-feature network's scoring reads
            them); () when no row sent any.
        decided_at: (N,) datetime64[us], when each decision was made (UTC).
        trained_in: (N,) the version whose training consumed the decision, -1 for none.
        imported: (N,) bool, read in by `rofu import` (policy "imported"): decided by
            another system, seen by a checkpoint only if its training consumed it.
        held_out: (N,) bool, served by a holdout's control (`rofu.service.deciding.holdout`):
            consumed by the trainer but never trained on.
    """

    contexts: np.ndarray
    candidates: np.ndarray
    actions: np.ndarray
    propensities: np.ndarray
    logging: np.ndarray
    rewards: np.ndarray
    explore: np.ndarray
    versions: np.ndarray
    catalogue: Catalogue
    unrewarded: int
    baselines: np.ndarray
    served_baseline: np.ndarray
    rule: np.ndarray
    decided_at: np.ndarray
    trained_in: np.ndarray
    imported: np.ndarray
    held_out: np.ndarray
    unactivated: int = 0
    arm_features: tuple[dict[str, list[float]] | None, ...] = ()

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    @property
    def n_slots(self) -> int:
        """S, the catalogue's slots."""
        return int(self.candidates.shape[1])

    def subset(self, rows: np.ndarray) -> ServiceLog:
        """The log of the rows a (N,) bool mask (or an index array) keeps."""
        arrays = {
            field.name: getattr(self, field.name)[rows]
            for field in dataclasses.fields(self)
            if isinstance(getattr(self, field.name), np.ndarray)
        }
        own = self.arm_features
        if own:
            own = tuple(own[i] for i in np.arange(len(self))[rows])
        return dataclasses.replace(self, **arrays, arm_features=own)


def read_service_log(
    sessions: SessionFactory, window: Window = EVERYTHING, default_reward: float | None = None
) -> ServiceLog:
    """The window's active decisions that have a reward (all of them with
    `default_reward`), with the checkpoint that consumed each; deferred decisions not
    activated in time are left out.

    Raises:
        EvaluationError: no decision has a reward, or the context length changes.
    """
    catalogue = CatalogueCache(sessions, ttl_s=0.0).refresh()
    slots = {arm.id: arm.slot for arm in catalogue.arms}
    rows: list[tuple[DecisionRecord, float]] = []
    unrewarded = unactivated = 0
    for record in iter_decisions(sessions, window):
        reward = record.reward if record.reward is not None else default_reward
        if not record.active:
            unactivated += 1
        elif reward is None:
            unrewarded += 1
        else:
            rows.append((record, reward))
    if not rows:
        raise EvaluationError(
            f"no rewarded decision in the window ({unrewarded} without a reward, "
            f"{unactivated} deferred and never activated); "
            "evaluation needs rewards (or ROFU_DEFAULT_REWARD)"
        )
    if len({len(record.context) for record, _ in rows}) > 1:
        raise EvaluationError("the context length changes within the window (--since/--until)")
    consumed = _consumed(sessions, window)
    return _arrays(rows, catalogue, slots, (unrewarded, unactivated), consumed)


def _consumed(sessions: SessionFactory, window: Window) -> dict[str, int]:
    """event id -> the version whose training consumed it, for the window's consumed
    decisions (the log's records leave this bookkeeping column out)."""
    query = select(DecisionRow.event_id, DecisionRow.trained_in).where(
        DecisionRow.trained_in.is_not(None)
    )
    if window.since is not None:
        query = query.where(DecisionRow.created_at >= window.since)
    if window.until is not None:
        query = query.where(DecisionRow.created_at < window.until)
    with database_errors(), sessions() as session, session.begin():
        return {
            event_id: version for event_id, version in session.execute(query) if version is not None
        }


def _utc_naive(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(tzinfo=None)


def _arrays(
    rows: list[tuple[DecisionRecord, float]],
    catalogue: Catalogue,
    slots: dict[str, int],
    left_out: tuple[int, int],  # (unrewarded, unactivated)
    consumed: dict[str, int],  # event id -> trained_in
) -> ServiceLog:
    n, width = len(rows), catalogue.n_slots
    candidates = np.zeros((n, width), dtype=bool)
    logging, rule = np.zeros((2, n, width))
    for i, (record, _) in enumerate(rows):
        columns = [slots[arm] for arm in record.candidates]
        candidates[i, columns] = True
        probabilities = record.probabilities
        logging[i, columns] = np.nan if probabilities is None else probabilities
        own = rule_probabilities(record)
        rule[i, columns] = np.nan if own is None else own
    records = [record for record, _ in rows]
    return ServiceLog(
        contexts=np.array([r.context for r in records], dtype=np.float64),
        candidates=candidates,
        actions=np.array([r.slot for r in records], dtype=np.int64),
        propensities=np.array([r.propensity for r in records]),
        logging=logging,
        rewards=np.array([reward for _, reward in rows]),
        explore=np.array([r.explore for r in records], dtype=bool),
        versions=np.array([r.model_version for r in records], dtype=np.int64),
        catalogue=catalogue,
        unrewarded=left_out[0],
        unactivated=left_out[1],
        baselines=np.array(
            [-1 if r.baseline_arm is None else slots[r.baseline_arm] for r in records],
            dtype=np.int64,
        ),
        served_baseline=np.array([r.policy == APPRENTICE for r in records], dtype=bool),
        rule=rule,
        decided_at=np.array([_utc_naive(r.created_at) for r in records], dtype="datetime64[us]"),
        trained_in=np.array([consumed.get(r.event_id, -1) for r in records], dtype=np.int64),
        imported=np.array([r.policy == IMPORTED for r in records], dtype=bool),
        held_out=np.array([r.experiment == HOLDOUT for r in records], dtype=bool),
        arm_features=_own_arm_features(records),
    )


def _own_arm_features(records: list[DecisionRecord]) -> tuple[dict[str, list[float]] | None, ...]:
    """Each row's own arm features; () when no row sent any (nothing to carry along)."""
    own = tuple(r.arm_features for r in records)
    return own if any(own) else ()


@dataclass(frozen=True)
class CheckpointScores:
    """A checkpoint's ROFU scores on the logged contexts: (N, S) mean and bonus (NaN off
    the candidates)."""

    version: int
    mean: np.ndarray
    bonus: np.ndarray


@dataclass(frozen=True)
class StoredCheckpoint:
    """A stored checkpoint made ready to score, with what its row and blob record."""

    snapshot: Snapshot
    created_at: datetime  # when it was stored (UTC): decisions after it may be fresh
    extra: dict[str, str]  # the trainer's record (`Checkpoint.extra`): its configuration, ...

    @property
    def version(self) -> int:
        """The checkpoint's version."""
        return self.snapshot.version


def load_stored(
    settings: Settings, sessions: SessionFactory, version: int | None = None
) -> StoredCheckpoint:
    """A stored checkpoint (None: the newest valid one), verified as a replica verifies it.

    Raises:
        EvaluationError: no such checkpoint, or it does not fit the settings' network.
    """
    name = "the newest checkpoint" if version is None else f"checkpoint {version}"
    store = CheckpointStore(sessions, settings.checkpoint_dir)
    try:
        found = store.latest() if version is None else store.get(version)
        if found is not None:
            row, blob = found
            net, seed = settings.served_net_configs(), settings.feature_hash_seed
            extra = load_served(blob, net, hash_seed=seed).extra
            snapshot = Snapshot.from_blob(blob, net, torch.device("cpu"), hash_seed=seed)
            return StoredCheckpoint(snapshot, row.created_at, extra)
    except CheckpointError as exc:  # damaged, unreadable, or another network's
        raise EvaluationError(f"{name}: {exc}") from exc
    raise EvaluationError(f"{name} is not stored")


def checkpoint_scores(
    settings: Settings,
    sessions: SessionFactory,
    log: ServiceLog,
    version: int | None = None,
    *,
    chunk: int = 256,
) -> CheckpointScores:
    """Score the log's contexts and candidates with a stored checkpoint (None: the newest)
    under the settings' ROFU configuration.

    Raises:
        EvaluationError: no such checkpoint, or it does not fit the settings' network.
    """
    stored = load_stored(settings, sessions, version)
    return score_checkpoint(settings, stored, log, settings.rofu_config(), chunk=chunk)


def score_checkpoint(
    settings: Settings,
    stored: StoredCheckpoint,
    log: ServiceLog,
    config: RofuConfig,
    *,
    chunk: int = 256,
) -> CheckpointScores:
    """Score the log's contexts and candidates with a loaded checkpoint under `config`
    (its estimator, bonus scale, ...), as the service scores them."""
    snapshot = stored.snapshot
    features = None
    if settings.arm_feature_dim:
        features = log.catalogue.feature_table(settings.arm_feature_dim)
    # prepared as the service prepares it (the step resolved, the NTK basis)
    prepared = prepare_served(snapshot, config, settings.seed, arm_features=features)
    width = snapshot.net.config.n_arms or log.n_slots
    mean, bonus = np.full((2, len(log), log.n_slots), np.nan)
    for start in range(0, len(log), chunk):
        rows = slice(start, start + chunk)
        mask = torch.zeros(len(log.contexts[rows]), width, dtype=torch.bool)
        mask[:, : log.n_slots] = torch.from_numpy(log.candidates[rows])
        contexts = snapshot.bounded(torch.tensor(log.contexts[rows], dtype=torch.float32))
        pair = _own_features(log, rows, features)
        if pair is not None and features is not None:  # clamped as /v1/select clamps them
            pair = snapshot.bounded_features(pair, features)
        scores = score(
            prepared,
            contexts,
            checkpoint_generator(settings.seed, snapshot.version),  # as each /select call
            candidates=mask,
            pair_features=pair,
        )
        mean[rows] = scores.mean.detach().double().numpy()[:, : log.n_slots]
        bonus[rows] = scores.bonus.detach().double().numpy()[:, : log.n_slots]
    return CheckpointScores(snapshot.version, mean, bonus)


def _own_features(
    log: ServiceLog, rows: slice, features: torch.Tensor | None
) -> torch.Tensor | None:
    """(B, S, F) the rows' arm features, the catalogue's with each request's own in place
    (as `/v1/select` scored them); None when no row of the chunk sent its own."""
    own = log.arm_features[rows]
    if features is None or not any(own):
        return None
    slots = {arm.id: arm.slot for arm in log.catalogue.arms}
    table = features.expand(len(own), *features.shape).clone()
    for row, given in enumerate(own):
        for arm, values in (given or {}).items():
            table[row, slots[arm]] = torch.tensor(values, dtype=table.dtype)
    return table
