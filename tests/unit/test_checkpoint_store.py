"""CheckpointStore: blobs in the database row or in a directory, committed atomically."""

from __future__ import annotations

from pathlib import Path

import pytest

from rofu.models import CheckpointError
from rofu.service import migrate
from rofu.service.db import repository
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.lifecycle.checkpoint_store import (
    CheckpointStore,
    CorruptCheckpoint,
    OversizedCheckpoint,
)
from rofu.service.metrics import ServiceMetrics
from tests.factories import checkpoint_blob

ONE, TWO = checkpoint_blob(1), checkpoint_blob(2)


@pytest.fixture
def sessions(tmp_path):
    url = f"sqlite:///{tmp_path}/store.sqlite"
    migrate.upgrade(url)
    engine = make_engine(url)
    yield session_factory(engine)
    engine.dispose()


def _save(store: CheckpointStore, version: int, blob: bytes):
    return store.save(version, blob, metrics={"loss": 0.5}, rows_trained=3, n_total=9, consumed=[])


def test_checkpoint_store_keeps_blobs_in_the_row_by_default(sessions):
    store = CheckpointStore(sessions)
    row = _save(store, 1, ONE)
    assert (row.blob, row.path, row.size_bytes) == (ONE, None, len(ONE))
    stored_row, blob = store.latest()
    assert (stored_row.version, blob, stored_row.metrics) == (1, ONE, {"loss": 0.5})


def test_checkpoint_store_writes_files_in_a_directory(sessions, tmp_path):
    directory = tmp_path / "checkpoints"
    store = CheckpointStore(sessions, directory)
    _save(store, 1, ONE)
    row = _save(store, 2, TWO)
    assert row.blob is None
    assert sorted(p.name for p in directory.iterdir()) == [
        f"checkpoint-00000001-{CheckpointStore.checksum(ONE)[:16]}.safetensors",
        f"checkpoint-00000002-{CheckpointStore.checksum(TWO)[:16]}.safetensors",
    ]
    assert store.get(1)[1] == ONE
    assert store.latest()[1] == TWO
    assert store.get(3) is None
    assert not list(directory.glob("*.partial"))


def test_checkpoint_store_a_failed_commit_leaves_no_row(sessions, tmp_path):
    store = CheckpointStore(sessions, tmp_path / "c")
    _save(store, 1, ONE)
    with pytest.raises(repository.ClaimLost, match="checkpoint 1 is stored already"):
        _save(store, 1, TWO)  # the same version twice: the row insert fails
    rows = repository.list_checkpoints(sessions)
    assert [(r.version, r.checksum) for r in rows] == [(1, CheckpointStore.checksum(ONE))]
    assert store.get(1)[1] == ONE  # the loser's file did not replace the stored one


def test_checkpoint_store_quarantines_bytes_that_are_not_the_recorded_ones(sessions, tmp_path):
    metrics = ServiceMetrics()
    store = CheckpointStore(sessions, tmp_path / "c", metrics)
    row = _save(store, 1, ONE)
    Path(row.path).write_bytes(TWO)  # tampered on disk
    with pytest.raises(CorruptCheckpoint, match="recorded checksum"):
        store.get(1)
    Path(row.path).write_bytes(ONE)  # even restored, it is never read again
    with pytest.raises(CorruptCheckpoint, match="is quarantined"):
        store.get(1)
    assert metrics.checkpoints_quarantined._value.get() == 1
    assert repository.get_checkpoint(sessions, 1).quarantine_reason == (
        "the bytes do not match the recorded checksum"
    )
    assert store.latest() is None


def test_checkpoint_store_refuses_a_missing_file_without_quarantine(sessions, tmp_path):
    store = CheckpointStore(sessions, tmp_path / "c")
    row = _save(store, 1, ONE)
    Path(row.path).unlink()  # it may come back (an unmounted volume): not quarantined
    for _ in range(2):
        with pytest.raises(CheckpointError, match="No such file") as refused:
            store.get(1)
        assert not isinstance(refused.value, CorruptCheckpoint)
    assert repository.get_checkpoint(sessions, 1).quarantined_at is None


@pytest.mark.parametrize("where", ["row", "directory"])
def test_checkpoint_store_latest_skips_damaged_checkpoints(sessions, tmp_path, where):
    metrics = ServiceMetrics()
    store = CheckpointStore(sessions, None if where == "row" else tmp_path / "c", metrics)
    _save(store, 1, ONE)
    _save(store, 2, TWO)
    damaged = bytearray(TWO)
    damaged[-10] ^= 0x01  # a flipped bit inside the tensors: the header is intact
    _damage(sessions, 2, bytes(damaged))
    row, blob = store.latest()
    assert (row.version, blob) == (1, ONE)
    assert store.latest()[0].version == 1  # found once, never read again
    assert metrics.checkpoints_quarantined._value.get() == 1
    assert (
        "checksum does not match its contents"
        in repository.get_checkpoint(sessions, 2).quarantine_reason
    )


def _damage(sessions, version: int, blob: bytes) -> None:
    row = repository.get_checkpoint(sessions, version)
    if row.path is not None:
        Path(row.path).write_bytes(blob)
        return
    with sessions() as session, session.begin():
        session.get(type(row), version).blob = blob


@pytest.mark.parametrize("where", ["row", "file"])
def test_checkpoint_store_refuses_a_blob_over_the_limit_unread(
    sessions, tmp_path, where, monkeypatch
):
    directory = None if where == "row" else tmp_path / "c"
    _save(CheckpointStore(sessions, directory), 1, ONE)
    _save(CheckpointStore(sessions, directory), 2, TWO)
    loaded: list[int] = []
    full_row = repository.get_checkpoint

    def spied(sessions, version, *, with_blob=True):
        loaded.extend([version] if with_blob else [])
        return full_row(sessions, version, with_blob=with_blob)

    monkeypatch.setattr(repository, "get_checkpoint", spied)
    store = CheckpointStore(sessions, directory, max_bytes=len(TWO) - 1)
    with pytest.raises(OversizedCheckpoint, match=f"stored checkpoint 2 is {len(TWO)} bytes"):
        store.get(2)
    with pytest.raises(OversizedCheckpoint):
        store.latest()
    assert loaded == []  # the row holding the bytes was never read
    assert repository.get_checkpoint(sessions, 2).quarantined_at is None  # not damaged
    assert CheckpointStore(sessions, directory, max_bytes=len(TWO)).get(2)[1] == TWO
