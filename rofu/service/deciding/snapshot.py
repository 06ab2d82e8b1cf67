"""The served model: an immutable snapshot, swapped atomically when a checkpoint arrives.

A batch takes `holder.current` once and scores entirely with it, so requests in flight
finish on the snapshot they started with while a newer one is swapped in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rofu.models import (
    Checkpoint,
    CheckpointError,
    RegulariserData,
    RewardNet,
    RewardNetConfig,
    load_checkpoint,
)
from rofu.models.checkpoint import checkpoint_checksum

#: The `Checkpoint.extra` key recording the feature hash seed (`ROFU_FEATURE_HASH_SEED`)
#: the checkpoint's named features were hashed with.
HASH_SEED_KEY = "feature_hash_seed"


def load_served(
    blob: bytes, expect: RewardNetConfig | Sequence[RewardNetConfig], *, hash_seed: int
) -> Checkpoint:
    """Verify and load a checkpoint this replica (or trainer) may serve or continue.

    Besides the network structure (`load_checkpoint`'s `expect`), the feature hash seed
    must be the configured one: under another seed a named feature lands in another
    index, so the network would read every hashed context wrongly. A checkpoint that
    records no seed was made before named features existed, from dense contexts only,
    which no seed changes: it is accepted.

    Raises:
        CheckpointError: a bad blob, another network structure or another hash seed.
    """
    checkpoint = load_checkpoint(blob, expect=expect)
    recorded = checkpoint.extra.get(HASH_SEED_KEY)
    if recorded is not None and recorded != str(hash_seed):
        raise CheckpointError(
            f"checkpoint {checkpoint.version} hashed named features with seed {recorded}, "
            f"this service with ROFU_FEATURE_HASH_SEED={hash_seed}: its features would "
            "mean something else"
        )
    return checkpoint


@dataclass(frozen=True)
class Snapshot:
    """A checkpoint made ready to score: network and regulariser data on the device."""

    version: int
    checksum: str
    net: RewardNet
    data: RegulariserData
    created_at: float  # unix time the trainer made it
    loaded_at: float  # unix time this replica loaded it
    # (D,) the range a context is clamped into before it is scored (None: no data yet)
    context_low: torch.Tensor | None = None
    context_high: torch.Tensor | None = None
    # (F,) the extremes of the arm features the sample's rows carry (None: none carry any)
    features_seen: tuple[torch.Tensor, torch.Tensor] | None = None
    # (name, prequential loss or None) of each candidate learner the trainer refitted,
    # and the one served (a checkpoint made without a family: the MLP alone)
    learners: tuple[tuple[str, float | None], ...] = ()
    served_learner: str = "mlp"

    def bounded(self, contexts: torch.Tensor) -> torch.Tensor:
        """(B, D) contexts clamped, feature by feature, into the range the network was
        trained on, widened on each side by that range's width (at least 1).

        A network is only trustworthy near its data, and far outside it its outputs and
        ROFU's ascent overflow; clamped, every accepted context can be scored.
        """
        if self.context_low is None or self.context_high is None:
            return contexts
        low = self.context_low.to(contexts.device, contexts.dtype)
        high = self.context_high.to(contexts.device, contexts.dtype)
        return torch.minimum(torch.maximum(contexts, low), high)

    def bounded_features(self, pair: torch.Tensor, catalogue: torch.Tensor) -> torch.Tensor:
        """(B, slots, F) per-request arm features clamped, feature by feature, into the range
        of the catalogue's (`catalogue`, (slots, F)) and the trained rows' arm features,
        widened like a context's (`bounded`): every accepted request can be scored."""
        seen = catalogue.to(pair)
        low, high = seen.min(dim=0).values, seen.max(dim=0).values
        if self.features_seen is not None:
            low = torch.minimum(low, self.features_seen[0].to(pair))
            high = torch.maximum(high, self.features_seen[1].to(pair))
        low, high = _widened(low, high)
        return torch.minimum(torch.maximum(pair, low), high)

    @classmethod
    def from_blob(
        cls,
        blob: bytes,
        expect: RewardNetConfig | Sequence[RewardNetConfig],
        device: torch.device,
        *,
        hash_seed: int,
    ) -> Snapshot:
        """Verify and load a checkpoint blob (`load_served`); raises CheckpointError if it
        is bad, of another network structure or of another feature hash seed."""
        checkpoint = load_served(blob, expect, hash_seed=hash_seed)
        try:
            created_at = float(checkpoint.extra.get("created_at", "nan"))
        except ValueError:
            created_at = float("nan")
        if created_at != created_at:  # NaN: not recorded
            created_at = time.time()
        net = checkpoint.network().to(device)
        data = checkpoint.data.with_sample(checkpoint.data.sample.to(device))
        low = high = None
        sample = checkpoint.data.sample
        if sample.x.shape[0] > 0:
            low, high = _widened(sample.x.min(dim=0).values, sample.x.max(dim=0).values)
        features_seen = None
        if sample.features is not None and sample.features.shape[0] > 0:
            features_seen = (sample.features.min(dim=0).values, sample.features.max(dim=0).values)
        return cls(
            version=checkpoint.version,
            checksum=checkpoint_checksum(blob),
            net=net,
            data=data,
            created_at=created_at,
            loaded_at=time.time(),
            context_low=low,
            context_high=high,
            features_seen=features_seen,
            **_learners(checkpoint),
        )


def _learners(checkpoint: Checkpoint) -> dict[str, Any]:
    """A snapshot's `learners` and `served_learner` fields from its checkpoint."""
    if not checkpoint.candidates:
        noise = checkpoint.data.noise
        return {"learners": (("mlp", None if noise is None else noise.variance),)}
    return {
        "learners": tuple((c.name, c.loss.variance) for c in checkpoint.candidates),
        "served_learner": checkpoint.served_learner,
    }


def _widened(low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[low, high] widened on each side by its width, at least 1."""
    width = (high - low).clamp(min=1.0)
    return low - width, high + width


class SnapshotHolder:
    """The replica's current snapshot (None before any checkpoint exists)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: Snapshot | None = None

    @property
    def current(self) -> Snapshot | None:
        """The snapshot new batches score with."""
        return self._current

    def swap(self, snapshot: Snapshot, *, only_newer: bool = True) -> bool:
        """Serve `snapshot` from now on, unless `only_newer` and it is not newer.

        Checkpoints can arrive by two paths at once (bus notice, store poll); refusing
        older ones keeps the served version from going back. Returns whether it swapped.
        """
        with self._lock:
            current = self._current
            if only_newer and current is not None and snapshot.version <= current.version:
                return False
            self._current = snapshot
        return True
