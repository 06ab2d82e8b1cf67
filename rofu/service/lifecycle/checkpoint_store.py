"""Durable checkpoints: a row per version, the blob in the row or in a directory.

The store never hands out damaged bytes: a checkpoint whose bytes do not match its row or
do not verify is quarantined (`rofu.service.db.quarantine`) and skipped from then on. Bytes
that cannot be read at all (a missing file, a permission), or more of them than
`max_bytes`, are refused but not quarantined: they may come back, or fit another limit.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

from rofu.models.checkpoint import CheckpointError, checkpoint_checksum, load_checkpoint
from rofu.service.db import quarantine, repository
from rofu.service.db.engine import SessionFactory
from rofu.service.db.tables import PROMOTED, CheckpointRow
from rofu.service.metrics import ServiceMetrics

log = logging.getLogger("rofu.checkpoints")


class CorruptCheckpoint(CheckpointError):
    """A stored checkpoint whose bytes are damaged; it is quarantined."""


class OversizedCheckpoint(CheckpointError):
    """A checkpoint blob larger than the limit, refused before it is read."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(
            f"{what} is {size} bytes, over the limit of {limit} (ROFU_MAX_CHECKPOINT_BYTES)"
        )
        self.size = size


class CheckpointStore:
    """Stores and fetches checkpoint blobs; the database row is the commit point."""

    def __init__(
        self,
        sessions: SessionFactory,
        directory: Path | None = None,
        metrics: ServiceMetrics | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self._sessions = sessions
        self._directory = directory
        self._metrics = metrics
        self._max_bytes = max_bytes  # None: any size is read
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)

    def save(
        self,
        version: int,
        blob: bytes,
        *,
        metrics: dict[str, Any],
        rows_trained: int,
        n_total: int,
        consumed: list[str],
        newest: int | None = None,
        parent: int | None = None,
        unrewarded: list[str] | None = None,
        status: str = PROMOTED,
        gate: dict[str, Any] | None = None,
    ) -> CheckpointRow:
        """Write the blob, then commit its row and claim the consumed decisions together
        (`repository.commit_checkpoint`, which checks `newest` and `parent`, and flags
        late the rewards that arrived meanwhile for the `unrewarded` ones).

        File names carry the checksum, so nothing is ever overwritten: a crash (or a
        second trainer losing its claim) leaves at most an orphan file, and the decisions
        stay unconsumed. `status` and `gate`: its evaluation gate state and figures
        (`rofu.service.db.gate_status`); a candidate is not served until promoted.

        Raises:
            ClaimLost: another trainer consumed a decision or stored a checkpoint first.
        """
        path = None if self._directory is None else self._write_file(version, blob)
        row = CheckpointRow(
            version=version,
            checksum=self.checksum(blob),
            size_bytes=len(blob),
            blob=blob if path is None else None,
            path=None if path is None else str(path),
            metrics=_json_safe(metrics),
            rows_trained=rows_trained,
            n_total=n_total,
            gate_status=status,
            gate=gate,
        )
        repository.commit_checkpoint(
            self._sessions,
            row,
            consumed,
            newest=newest,
            parent=parent,
            unrewarded=unrewarded or (),
        )
        return row

    def _write_file(self, version: int, blob: bytes) -> Path:
        assert self._directory is not None
        final = self._directory / f"checkpoint-{version:08d}-{self.checksum(blob)[:16]}.safetensors"
        partial = final.with_suffix(".partial")
        with open(partial, "wb") as out:
            out.write(blob)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, final)
        directory = os.open(self._directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return final

    @staticmethod
    def checksum(blob: bytes) -> str:
        """The checksum recorded inside a checkpoint blob."""
        return checkpoint_checksum(blob)

    def blob(self, row: CheckpointRow) -> bytes:
        """The bytes of a stored checkpoint, verified; damaged ones are quarantined.

        Raises:
            CorruptCheckpoint: the checkpoint is quarantined, or its bytes are not the
                recorded ones or do not verify (it is quarantined now).
            CheckpointError: the bytes cannot be read (a missing file, a permission).
        """
        if row.quarantined_at is not None:
            raise CorruptCheckpoint(
                f"checkpoint {row.version} is quarantined: {row.quarantine_reason}"
            )
        blob = self._read(row)
        damage = _damage(row, blob)
        if damage is not None:
            self.quarantine(row.version, damage)
            raise CorruptCheckpoint(f"checkpoint {row.version} is damaged: {damage}")
        return blob

    @staticmethod
    def _read(row: CheckpointRow) -> bytes:
        if row.blob is not None:
            return bytes(row.blob)
        if row.path is None:
            raise CheckpointError(f"checkpoint {row.version} has neither blob nor path")
        try:
            return Path(row.path).read_bytes()
        except OSError as exc:
            raise CheckpointError(f"checkpoint {row.version}: {exc}") from exc

    def quarantine(self, version: int, reason: str) -> bool:
        """Record checkpoint `version` as damaged, once; logged and counted by whoever
        records it. Returns whether this call did."""
        if not quarantine.quarantine(self._sessions, version, reason):
            return False
        log.error(
            "checkpoint %s quarantined: %s; it is never loaded again, and the newest valid "
            "checkpoint is served and trained on",
            version,
            reason,
        )
        if self._metrics is not None:
            self._metrics.checkpoints_quarantined.inc()
        return True

    def latest(self) -> tuple[CheckpointRow, bytes] | None:
        """The newest valid promoted checkpoint (served unpinned) and its bytes; damaged
        ones on the way are quarantined and skipped.

        Raises:
            CheckpointError: the newest unquarantined checkpoint cannot be read.
        """
        while (row := repository.latest_checkpoint(self._sessions, with_blob=False)) is not None:
            try:
                found = self.get(row.version)
            except CorruptCheckpoint:
                continue  # quarantined now: the next newest
            if found is not None:
                return found
        return None

    def get(self, version: int) -> tuple[CheckpointRow, bytes] | None:
        """A durable checkpoint by version, with its verified bytes (see `blob`).

        Raises:
            OversizedCheckpoint: its bytes are more than `max_bytes`; nothing was read.
            CorruptCheckpoint, CheckpointError: see `blob`.
        """
        self._check_size(version)
        row = repository.get_checkpoint(self._sessions, version)
        return None if row is None else (row, self.blob(row))

    def _check_size(self, version: int) -> None:
        """Refuse a checkpoint over `max_bytes` from its row's blob length or its file's size."""
        if self._max_bytes is None:
            return
        found = repository.checkpoint_blob_size(self._sessions, version)
        if found is None:
            return
        size, path = found
        if path is not None:
            try:
                size = os.stat(path).st_size
            except OSError:
                return  # `_read` says why it cannot be read
        if size is not None and size > self._max_bytes:
            raise OversizedCheckpoint(f"stored checkpoint {version}", size, self._max_bytes)


def _damage(row: CheckpointRow, blob: bytes) -> str | None:
    """What is wrong with a stored checkpoint's bytes (None: they verify)."""
    try:
        if checkpoint_checksum(blob) != row.checksum:
            return "the bytes do not match the recorded checksum"
        stored = load_checkpoint(blob)  # the contents' checksum and structure
    except CheckpointError as exc:
        return str(exc)
    if stored.version != row.version:
        return f"the bytes hold version {stored.version}"
    return None


def _json_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics with every non-finite number (a NaN loss, an overflowed gradient norm)
    as null: Postgres's JSON refuses NaN and Infinity, and the row must still commit."""
    return {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in metrics.items()
    }
