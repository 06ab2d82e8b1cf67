"""Durable checkpoints: a row per version, the blob in the row or in a directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from models.checkpoint import CheckpointError, checkpoint_checksum
from service.db import repository
from service.db.engine import SessionFactory
from service.db.tables import CheckpointRow


class CheckpointStore:
    """Stores and fetches checkpoint blobs; the database row is the commit point."""

    def __init__(self, sessions: SessionFactory, directory: Path | None = None) -> None:
        self._sessions = sessions
        self._directory = directory
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
    ) -> CheckpointRow:
        """Write the blob, then commit its row and the consumed decisions together.

        File names carry the checksum, so nothing is ever overwritten: a crash (or a
        second trainer losing the race for the version) leaves at most an orphan file,
        and the decisions stay unconsumed.
        """
        path = None if self._directory is None else self._write_file(version, blob)
        row = CheckpointRow(
            version=version,
            checksum=self.checksum(blob),
            size_bytes=len(blob),
            blob=blob if path is None else None,
            path=None if path is None else str(path),
            metrics=metrics,
            rows_trained=rows_trained,
            n_total=n_total,
        )
        repository.commit_checkpoint(self._sessions, row, consumed)
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
        """The bytes of a stored checkpoint, checked against the checksum on its row.

        Raises:
            CheckpointError: the bytes are missing, unreadable or not the recorded ones.
        """
        if row.blob is not None:
            blob = bytes(row.blob)
        elif row.path is not None:
            try:
                blob = Path(row.path).read_bytes()
            except OSError as exc:
                raise CheckpointError(f"checkpoint {row.version}: {exc}") from exc
        else:
            raise CheckpointError(f"checkpoint {row.version} has neither blob nor path")
        if self.checksum(blob) != row.checksum:
            raise CheckpointError(f"checkpoint {row.version} does not match its recorded checksum")
        return blob

    def latest(self) -> tuple[CheckpointRow, bytes] | None:
        """The newest durable checkpoint and its bytes."""
        row = repository.latest_checkpoint(self._sessions)
        return None if row is None else (row, self.blob(row))

    def get(self, version: int) -> tuple[CheckpointRow, bytes] | None:
        """A durable checkpoint by version, with its bytes."""
        row = repository.get_checkpoint(self._sessions, version)
        return None if row is None else (row, self.blob(row))
