"""Which logged decisions a checkpoint has not seen.

A policy built on a checkpoint scored on the rows that checkpoint was fitted on looks
better than it is: its mean chose, row by row, the arms whose logged rewards it learned.
A row is fresh for checkpoint v when it was decided after v was stored and no training
of v or of an earlier version consumed it (`trained_in` is unset or later than v; the
trainer marks every decision it consumes, `rofu.service.db.repository.commit_checkpoint`).
An imported row (`rofu import`: decided by another system, e.g. Personalizer, before
or after v was stored) is fresh for v unless the training of v or an earlier version
consumed it: no rofu model decided it, so the only way a checkpoint can have seen its
reward is through a training run that consumed it, which `trained_in` records. This is
what lets `rofu train --from-log --holdout` evaluate the checkpoint it makes on the
imported rows it left out. A holdout's decision (`rofu.service.deciding.holdout`) is
consumed by a training run but never fitted: it is fresh as any other row, and never
counted among the rows a checkpoint saw.
`rofu evaluate` scores each checkpoint's policies on its fresh rows unless told to use
every row (`--include-training-rows`), and then counts the rows the checkpoint saw.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np

from rofu.service.log.service_log import ServiceLog


def fresh_rows(log: ServiceLog, version: int, created_at: datetime) -> np.ndarray:
    """(N,) bool: the rows decided after checkpoint `version` was stored at `created_at`,
    or imported, and consumed by no training of it or an earlier version."""
    stored = np.datetime64(created_at.astimezone(UTC).replace(tzinfo=None), "us")
    unconsumed = (log.trained_in < 0) | (log.trained_in > version)
    fresh: np.ndarray = ((log.decided_at > stored) | log.imported) & unconsumed
    return fresh


def seen_rows(log: ServiceLog, version: int) -> np.ndarray:
    """(N,) bool: the rows the training of checkpoint `version` or an earlier one consumed
    and fitted (a holdout's rows are consumed unfitted)."""
    seen: np.ndarray = (log.trained_in >= 0) & (log.trained_in <= version) & ~log.held_out
    return seen


def _moment(value: np.datetime64) -> str:
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC).isoformat()


def span(log: ServiceLog, rows: np.ndarray) -> dict[str, Any]:
    """The rows a (N,) bool mask keeps: how many, and the first and last decision time."""
    times = log.decided_at[rows]
    if times.size == 0:
        return {"rows": 0, "first": None, "last": None}
    return {"rows": int(times.size), "first": _moment(times.min()), "last": _moment(times.max())}
