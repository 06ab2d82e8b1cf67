"""The configuration a checkpoint recorded, which `rofu evaluate` scores it under.

The trainer records in every checkpoint (`Checkpoint.extra["config"]`,
`Settings.model_config_record`) the ROFU configuration it was made for: estimator, bonus
scale, selection rule, exploration floor, igw gamma, ... A checkpoint is scored with that,
not with the settings of the shell that runs the evaluation, which may not be the
service's. A checkpoint made before the record existed (or whose record does not parse)
is scored with the shell's settings, and the report says so; a record that lacks fields
added since takes those from the settings, also said. The record is the trainer's
settings; replicas configured otherwise serve another rule, which `log_mismatch` finds
by comparing the recorded rule's probabilities with those logged on the same decisions.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rofu.models import RofuConfig
from rofu.service.log.service_log import ServiceLog

#: The `Checkpoint.extra` key of the trainer's configuration record (a JSON object whose
#: `rofu` entry is the `RofuConfig` as a dict).
CONFIG_KEY = "config"
#: The figures of a configuration the report shows.
SHOWN = ("selection", "exploration_floor", "igw_gamma", "bonus_scale", "estimator")
#: Mean total variation between a checkpoint's probabilities under its record and those
#: logged when it served past which the report says the service served another rule.
MISMATCH = 0.01


@dataclass(frozen=True)
class ServingConfig:
    """A checkpoint's ROFU configuration and where it came from.

    Attributes:
        rofu: the configuration it is scored under.
        recorded: whether the checkpoint recorded it (False: the shell's settings).
        missing: fields the record lacks, taken from the settings.
    """

    rofu: RofuConfig
    recorded: bool
    missing: tuple[str, ...] = ()

    def describe(self) -> str:
        """The selection rule in words: `argmax, floor 0.2, bonus x1 (ntk)`."""
        c = self.rofu
        igw = f", gamma {c.igw_gamma:g}" if c.selection == "igw" else ""
        return (
            f"{c.selection}{igw}, floor {c.exploration_floor:g}, bonus x{c.bonus_scale:g} "
            f"({c.estimator})"
        )

    def figures(self) -> dict[str, Any]:
        """The report's JSON of it."""
        shown = {name: getattr(self.rofu, name) for name in SHOWN}
        source = "checkpoint" if self.recorded else "settings"
        return shown | {"source": source, "missing": list(self.missing)}


def recorded_config(extra: Mapping[str, str], settings: RofuConfig) -> ServingConfig:
    """The ROFU configuration a checkpoint's `extra` records, else `settings`."""
    record = _record(extra.get(CONFIG_KEY))
    if record is None:
        return ServingConfig(settings, recorded=False)
    names = {field.name for field in dataclasses.fields(RofuConfig)}
    given = {name: value for name, value in record.items() if name in names}
    try:
        config = dataclasses.replace(settings, **given)
    except (TypeError, ValueError):  # a value the current RofuConfig refuses
        return ServingConfig(settings, recorded=False)
    return ServingConfig(config, recorded=True, missing=tuple(sorted(names - given.keys())))


def _record(text: str | None) -> dict[str, Any] | None:
    """The `rofu` entry of a configuration record, None if absent or malformed."""
    if text is None:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    rofu = record.get("rofu") if isinstance(record, dict) else None
    return rofu if isinstance(rofu, dict) else None


def log_mismatch(
    probabilities: np.ndarray, log: ServiceLog, rows: np.ndarray, version: int
) -> dict[str, Any] | None:
    """How far a checkpoint's (N, S) probabilities under its recorded configuration are
    from those its service logged: the mean total variation distance over the (N,) bool
    `rows` decided by `version` with rofu's rule logged. None without any such row."""
    logged = rows & (log.versions == version) & ~np.isnan(log.rule).any(axis=1)
    if not logged.any():
        return None
    distance = 0.5 * np.abs(probabilities[logged] - log.rule[logged]).sum(axis=1)  # (n,)
    return {"rows": int(logged.sum()), "total_variation": float(distance.mean())}
