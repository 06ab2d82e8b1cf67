"""The checkpoint bus: the trainer publishes, every replica follows.

`InProcessBus` serves the embedded default (trainer thread and API in one process);
the Redis bus serves production (see the trainer issue).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

Listener = Callable[[int, bytes], object]


class CheckpointBus(Protocol):
    """Where checkpoints are announced after they are stored durably."""

    def publish(self, version: int, blob: bytes) -> None:
        """Announce a stored checkpoint."""
        ...


class NullBus:
    """Announces nothing: replicas find new checkpoints by polling the database."""

    def publish(self, version: int, blob: bytes) -> None:
        """Do nothing."""


class InProcessBus:
    """Calls every listener synchronously, in the publishing thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(version, blob)` on every publish."""
        with self._lock:
            self._listeners.append(listener)

    def publish(self, version: int, blob: bytes) -> None:
        """Hand the checkpoint to every listener."""
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(version, blob)
