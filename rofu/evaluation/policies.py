"""The policies `rofu evaluate` estimates, each with the rows it is estimated on.

Each checkpoint's policies (as served, greedy, other floors and bonus scales; an older
checkpoint as it served) are scored under the configuration that checkpoint recorded
(`rofu.evaluation.recorded`) on the rows fresh for it (`rofu.service.log.fresh`); uniform
on the served checkpoint's rows, which the logged value is also estimated on, so the
served family, uniform and the log are compared on the same rows. `everything`
(`--include-training-rows`) puts every row of the window under every policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rofu.evaluation.recorded import MISMATCH, ServingConfig, log_mismatch, recorded_config
from rofu.models.selection import ARGMAX, SelectionRule
from rofu.service.db import repository
from rofu.service.db.engine import SessionFactory
from rofu.service.log.fresh import fresh_rows, seen_rows
from rofu.service.log.off_policy import rule_probabilities as rule_probabilities
from rofu.service.log.service_log import (
    EvaluationError,
    ServiceLog,
    StoredCheckpoint,
    load_stored,
    score_checkpoint,
)
from rofu.service.settings import Settings

UNIFORM = "every candidate alike"


@dataclass(frozen=True)
class TargetPolicy:
    """A policy to evaluate: its (N, S) choice probabilities on the log (0 off `rows`),
    the (N,) bool rows it is estimated on, what it is and the checkpoint it rests on."""

    name: str
    probabilities: np.ndarray
    rows: np.ndarray
    note: str
    checkpoint: int | None = None
    config: ServingConfig | None = None


@dataclass(frozen=True)
class Variations:
    """The alternatives to the served policy to evaluate.

    Attributes:
        floors: other exploration floors under the served model.
        bonus_scales: multiples of the served bonus (the recorded bonus scale x this).
        checkpoints: stored versions to replay (None: the one before the served one).
    """

    floors: tuple[float, ...] = (0.05, 0.2)
    bonus_scales: tuple[float, ...] = (0.5, 2.0)
    checkpoints: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Plan:
    """The policies to evaluate, the rows uniform and the logged value are estimated on
    (the served checkpoint's), the served checkpoint (None: none is stored) with its
    configuration and how far that is from what its service logged (`log_mismatch`),
    and what the report must say about them."""

    policies: list[TargetPolicy]
    reference: np.ndarray
    served: StoredCheckpoint | None = None
    served_config: ServingConfig | None = None
    mismatch: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def uniform_probabilities(log: ServiceLog) -> np.ndarray:
    """(N, S) uniform over each decision's candidates."""
    counts = log.candidates.sum(axis=1, keepdims=True)
    uniform: np.ndarray = log.candidates / counts
    return uniform


def _on_rows(part: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(N, S) from the (n, S) probabilities of the n rows a (N,) bool mask keeps."""
    full = np.zeros((rows.shape[0], part.shape[1]))
    full[rows] = part
    return full


def checkpoint_rows(log: ServiceLog, stored: StoredCheckpoint, everything: bool) -> np.ndarray:
    """(N,) bool: the rows a checkpoint's policies are estimated on."""
    if everything:
        return np.ones(len(log), dtype=bool)
    return fresh_rows(log, stored.version, stored.created_at)


def no_fresh_rows(log: ServiceLog, stored: StoredCheckpoint) -> EvaluationError:
    """The error of a served checkpoint with no fresh row in the window."""
    v, fitted = stored.version, int(seen_rows(log, stored.version).sum())
    return EvaluationError(
        f"no rewarded decision of the window is fresh for the served checkpoint v{v} "
        f"(decided after it was stored at {stored.created_at.isoformat()} and consumed by "
        f"no training of it or an earlier version; {fitted} of the {len(log)} rows were "
        "consumed, the others decided before it): wait for decisions after the checkpoint, "
        "or pass --include-training-rows to evaluate on every row (optimistic)"
    )


def _config(settings: Settings, stored: StoredCheckpoint, notes: list[str]) -> ServingConfig:
    """The configuration a checkpoint recorded; notes where the settings stand in."""
    config = recorded_config(stored.extra, settings.rofu_config())
    v = stored.version
    if not config.recorded:
        notes.append(
            f"checkpoint v{v} records no serving configuration: scored with this shell's "
            f"settings ({config.describe()}), which may not be what it served"
        )
    elif config.missing:
        notes.append(
            f"checkpoint v{v}'s record lacks {', '.join(config.missing)}: this shell's "
            "settings stand in"
        )
    return config


def _describe(config: ServingConfig, version: int) -> str:
    if config.recorded:
        return f"{config.describe()}, as v{version} recorded"
    return f"{config.describe()}, this shell's settings (v{version} recorded none)"


def served_policies(
    settings: Settings,
    log: ServiceLog,
    stored: StoredCheckpoint,
    rows: np.ndarray,
    variations: Variations,
    config: ServingConfig,
) -> list[TargetPolicy]:
    """The served checkpoint's policies: as served, greedy and the variations."""
    part = log.subset(rows)
    scores = score_checkpoint(settings, stored, part, config.rofu)
    rule, v = config.rofu.rule, stored.version

    def policy(name: str, probabilities: np.ndarray, note: str) -> TargetPolicy:
        return TargetPolicy(name, _on_rows(probabilities, rows), rows, note, v, config)

    policies = [
        policy(f"served v{v}", rule_probabilities(scores, part, rule), _describe(config, v)),
        policy(f"greedy v{v}", rule_probabilities(scores, part, ARGMAX, 0.0), "mean only"),
    ]
    for floor in variations.floors:
        if floor != rule.exploration_floor:
            other = SelectionRule(rule.selection, floor, rule.igw_gamma)
            probabilities = rule_probabilities(scores, part, other)
            policies.append(policy(f"served v{v}, floor {floor:g}", probabilities, ""))
    for scale in variations.bonus_scales:
        probabilities = rule_probabilities(scores, part, rule, scale)
        policies.append(policy(f"served v{v}, bonus x{scale:g}", probabilities, ""))
    return policies


def older_policy(
    settings: Settings,
    log: ServiceLog,
    stored: StoredCheckpoint,
    rows: np.ndarray,
    notes: list[str],
) -> TargetPolicy:
    """An older (or any other) checkpoint under its own recorded configuration."""
    config = _config(settings, stored, notes)
    part = log.subset(rows)
    scores = score_checkpoint(settings, stored, part, config.rofu)
    probabilities = _on_rows(rule_probabilities(scores, part, config.rofu.rule), rows)
    v = stored.version
    return TargetPolicy(f"checkpoint v{v}", probabilities, rows, _describe(config, v), v, config)


def target_policies(
    settings: Settings,
    sessions: SessionFactory,
    log: ServiceLog,
    variations: Variations = Variations(),
    *,
    everything: bool = False,
) -> Plan:
    """The policies to evaluate, each on its rows (every row with `everything`).

    Raises:
        EvaluationError: the served checkpoint cannot be loaded, or has no fresh row.
    """
    notes: list[str] = []
    pin = repository.get_pin(sessions)
    if pin is None and repository.latest_checkpoint(sessions, with_blob=False) is None:
        notes.append("no checkpoint is stored: no model was fitted on any row")
        every = np.ones(len(log), dtype=bool)
        uniform = TargetPolicy("uniform", uniform_probabilities(log), every, UNIFORM)
        return Plan([uniform], every, notes=notes)
    served = load_stored(settings, sessions, pin)
    rows = checkpoint_rows(log, served, everything)
    if not rows.any():
        raise no_fresh_rows(log, served)
    config = _config(settings, served, notes)
    uniform_rows = _on_rows(uniform_probabilities(log)[rows], rows)
    family = served_policies(settings, log, served, rows, variations, config)
    mismatch = log_mismatch(family[0].probabilities, log, rows, served.version)
    _note_mismatch(mismatch, served.version, notes)
    policies = [TargetPolicy("uniform", uniform_rows, rows, UNIFORM), *family]
    for version in _older(sessions, variations.checkpoints, served.version):
        older = _older_policy(settings, sessions, log, version, everything, notes)
        policies += [] if older is None else [older]
    return Plan(policies, rows, served, config, mismatch, notes)


def _note_mismatch(mismatch: dict[str, Any] | None, version: int, notes: list[str]) -> None:
    if mismatch is not None and mismatch["total_variation"] > MISMATCH:
        notes.append(
            f"on the {mismatch['rows']} rows v{version} decided, the choice probabilities of "
            "its recorded configuration differ from the logged ones (mean total variation "
            f"{mismatch['total_variation']:.3f}): the service served other settings than the "
            "trainer recorded"
        )


def _older_policy(
    settings: Settings,
    sessions: SessionFactory,
    log: ServiceLog,
    version: int,
    everything: bool,
    notes: list[str],
) -> TargetPolicy | None:
    """Checkpoint `version`'s policy on its rows; None, with a note, where it is not
    stored or has no fresh row."""
    try:
        stored = load_stored(settings, sessions, version)
    except EvaluationError as exc:
        notes.append(str(exc))
        return None
    rows = checkpoint_rows(log, stored, everything)
    if not rows.any():
        notes.append(f"checkpoint v{version}: no rewarded decision of the window is fresh for it")
        return None
    return older_policy(settings, log, stored, rows, notes)


def _older(sessions: SessionFactory, versions: tuple[int, ...] | None, served: int) -> list[int]:
    if versions is not None:
        return [v for v in versions if v != served]
    rows = repository.list_checkpoints(sessions, limit=20, before=served)
    return [row.version for row in rows if row.quarantined_at is None][:1]
