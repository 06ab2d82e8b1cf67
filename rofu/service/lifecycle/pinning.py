"""Rollback: pin the served model to a stored checkpoint, and unpin it.

The pin lives in the database (durable, shared by every replica); a bus notice makes
replicas apply it at once, and their periodic sync applies it anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

from rofu.models import CheckpointError, RewardNetConfig
from rofu.service.db import repository
from rofu.service.db.engine import SessionFactory
from rofu.service.db.tables import PROMOTED
from rofu.service.deciding.snapshot import load_served
from rofu.service.errors import Conflict, NotFound
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.redis_bus import PIN_NOTICE, RedisBus, send_notice


def pin(
    sessions: SessionFactory,
    store: CheckpointStore,
    expect: RewardNetConfig | Sequence[RewardNetConfig],
    version: int,
    bus: RedisBus | None = None,
    *,
    hash_seed: int,
) -> None:
    """Serve checkpoint `version` on every replica until `unpin`.

    Raises:
        NotFound: no stored checkpoint has that version.
        Conflict: the stored checkpoint is not promoted (a candidate, or rejected by the
            evaluation gate), is quarantined, cannot be read or fails
            verification, of another network or feature hash seed (it would be refused).
    """
    try:
        stored = store.get(version)  # damaged bytes are quarantined here
    except CheckpointError as exc:
        raise Conflict(f"checkpoint {version} cannot be pinned: {exc}", field="version") from exc
    if stored is None:
        raise NotFound(f"no checkpoint with version {version}", field="version")
    if stored[0].gate_status != PROMOTED:  # only what the gate (or an operator) let through
        raise Conflict(
            f"checkpoint {version} is {stored[0].gate_status}, not promoted: promote it first "
            f"(rofu promote {version})",
            field="version",
        )
    try:
        load_served(stored[1], expect, hash_seed=hash_seed)
    except CheckpointError as exc:
        raise Conflict(f"checkpoint {version} fails verification: {exc}", field="version") from exc
    repository.set_pin(sessions, version)
    send_notice(bus, PIN_NOTICE, "pin")


def unpin(sessions: SessionFactory, bus: RedisBus | None = None) -> None:
    """Serve the newest promoted checkpoint again."""
    repository.set_pin(sessions, None)
    send_notice(bus, PIN_NOTICE, "pin")
