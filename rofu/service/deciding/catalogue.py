"""The arm catalogue as replicas see it: an immutable view refreshed from the database."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rofu.service.db import arms as arm_rows
from rofu.service.db.engine import SessionFactory
from rofu.service.errors import InvalidInput

#: The bus message that tells every replica to reload the catalogue after a change.
ARMS_NOTICE = "arms"


@dataclass(frozen=True)
class Arm:
    """One arm: its id, its slot (network output or feature row) and its state."""

    id: str
    slot: int
    features: tuple[float, ...] | None
    active: bool


@dataclass(frozen=True)
class Catalogue:
    """All arms (active and retired) at one moment."""

    arms: tuple[Arm, ...]

    @property
    def by_id(self) -> dict[str, Arm]:
        """Arms keyed by id."""
        return {arm.id: arm for arm in self.arms}

    @property
    def active(self) -> list[Arm]:
        """Arms that may be selected, by slot."""
        return [arm for arm in self.arms if arm.active]

    @property
    def n_slots(self) -> int:
        """One past the highest slot ever used."""
        return max((arm.slot for arm in self.arms), default=-1) + 1

    def candidates(self, arms: Sequence[str] | None, exclude: Sequence[str] | None) -> list[Arm]:
        """The arms a request may get: `arms` (default all active) minus `exclude`.

        Raises:
            InvalidInput: an unknown, retired or repeated arm (the field names its index,
                `arms.2`), or no arm left.
        """
        by_id = self.by_id
        for field, ids in (("arms", arms or ()), ("exclude", exclude or ())):
            seen: set[str] = set()
            for index, arm_id in enumerate(ids):
                where = f"{field}.{index}"
                if arm_id not in by_id:
                    raise InvalidInput(f"{where}: unknown arm {arm_id!r}", field=where)
                if arm_id in seen:
                    raise InvalidInput(
                        f"{where}: arm {arm_id!r} is repeated (arm ids must be unique)",
                        field=where,
                    )
                seen.add(arm_id)
        if arms is not None and not arms:
            raise InvalidInput("arms: name at least one arm (or omit arms)", field="arms")
        if arms is None:
            chosen = self.active
        else:
            retired = next((i for i, arm_id in enumerate(arms) if not by_id[arm_id].active), None)
            if retired is not None:
                field = f"arms.{retired}"
                raise InvalidInput(f"{field}: arm {arms[retired]!r} is retired", field=field)
            chosen = [by_id[arm_id] for arm_id in arms]
        excluded = set(exclude or ())
        left = [arm for arm in chosen if arm.id not in excluded]
        if not left:
            raise InvalidInput("no candidate arm is left after exclude", field="exclude")
        return left

    def feature_table(self, feature_dim: int) -> Tensor:
        """(slots, F) arm features by slot, for an arm-feature network."""
        table = torch.zeros(self.n_slots, feature_dim)
        for arm in self.arms:
            if arm.features is not None:
                table[arm.slot] = torch.tensor(arm.features)
        return table


class CatalogueCache:
    """Holds the current `Catalogue`; refreshed after local changes and every `ttl_s`."""

    def __init__(self, sessions: SessionFactory, ttl_s: float) -> None:
        self._sessions = sessions
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._current = Catalogue(())
        self._loaded_at = float("-inf")

    @property
    def current(self) -> Catalogue:
        """The catalogue as last loaded."""
        return self._current

    def refresh(self) -> Catalogue:
        """Reload from the database (blocking)."""
        rows = arm_rows.list_arms(self._sessions)
        catalogue = Catalogue(
            tuple(
                Arm(row.id, row.slot, tuple(row.features) if row.features else None, row.active)
                for row in rows
            )
        )
        with self._lock:
            self._current, self._loaded_at = catalogue, time.monotonic()
        return catalogue

    def fresh(self) -> Catalogue:
        """The catalogue, reloaded first when older than the TTL (blocking)."""
        if time.monotonic() - self._loaded_at > self._ttl_s:
            return self.refresh()
        return self._current
