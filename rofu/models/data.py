"""Typed data contracts: logged transitions, the regulariser's data, a growable buffer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from rofu.models.validation import (
    as_context_shape,
    check_float,
    check_float_tensor,
    check_int,
    describe_contexts,
    require_tensor,
)


@dataclass(frozen=True)
class Transitions:
    """Logged (context, arm, reward) triples.

    Attributes:
        x: (N, D) contexts, or (N, *context_shape) for contexts of another shape (images).
        arms: (N,) int64 arm indices.
        rewards: (N,) observed rewards.
        features: (N, F) the arm features each row's arm was scored with, for an
            arm-feature network whose arms' features vary by row (per-request features);
            None: row n reads `arm_features[arms[n]]` from the caller's table.
    """

    x: Tensor
    arms: Tensor
    rewards: Tensor
    features: Tensor | None = None

    def __post_init__(self) -> None:
        x = require_tensor("x", self.x)
        if x.dim() < 2:
            raise ValueError(f"x must have shape (N, *context_shape), got {tuple(x.shape)}")
        check_float_tensor("x", x, ndim=x.dim())
        n = x.shape[0]
        arms = require_tensor("arms", self.arms)
        if arms.dtype != torch.int64:
            raise TypeError(f"arms must be an int64 tensor, got {arms.dtype}")
        if tuple(arms.shape) != (n,):
            raise ValueError(f"arms must have shape ({n},), got {tuple(arms.shape)}")
        if n and int(arms.min()) < 0:
            raise ValueError("arms contains a negative arm index")
        check_float_tensor("rewards", self.rewards, ndim=1, size={0: n})
        if self.features is not None:
            check_float_tensor("features", self.features, ndim=2, size={0: n})

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def subset(self, index: Tensor) -> Transitions:
        """Rows picked by an index or boolean mask."""
        features = None if self.features is None else self.features[index]
        return Transitions(self.x[index], self.arms[index], self.rewards[index], features)

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> Transitions:
        """This batch on a device (and floating dtype); itself when already there."""
        x = self.x.to(device=device, dtype=dtype)
        if x is self.x:  # torch's own rule: a bare `cuda` is the current CUDA device
            return self
        return Transitions(
            x,
            self.arms.to(device=device),
            self.rewards.to(device=device, dtype=dtype),
            None if self.features is None else self.features.to(device=device, dtype=dtype),
        )

    def with_features(self, arm_features: Tensor) -> Transitions:
        """These rows carrying their arms' features from an (A, F) table (a no-op when they
        carry their own already)."""
        if self.features is not None:
            return self
        return Transitions(self.x, self.arms, self.rewards, arm_features[self.arms].to(self.x))

    @staticmethod
    def concat(parts: list[Transitions]) -> Transitions:
        """Stack several batches of transitions (all with per-row features, or none)."""
        if not parts:
            raise ValueError("parts must hold at least one batch")
        carrying = {p.features is not None for p in parts}
        if len(carrying) > 1:
            raise ValueError("parts must all carry per-row features, or none")
        features = None
        if carrying == {True}:
            features = torch.cat([p.features for p in parts if p.features is not None])
        return Transitions(
            torch.cat([p.x for p in parts]),
            torch.cat([p.arms for p in parts]),
            torch.cat([p.rewards for p in parts]),
            features,
        )


def feature_rows(
    arms: Tensor, features: Tensor | None, arm_features: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """The index and table through which N rows read their arm features.

    Without per-row `features` (N, F), row n reads `arm_features[arms[n]]`: (arms,
    arm_features) as they are. With them, the table is `arm_features` followed by the
    rows' own features, and row n reads row A + n of it; the callers' other indices into
    `arm_features` keep their meaning. Plain tensor operations, so a CUDA graph can
    capture them.
    """
    if features is None:
        return arms, arm_features
    if arm_features is None:
        return torch.arange(features.shape[0], device=features.device), features
    offset = arm_features.shape[0]
    rows = offset + torch.arange(features.shape[0], device=arm_features.device)
    return rows, torch.cat([arm_features, features.to(arm_features)])


@dataclass(frozen=True)
class Prequential:
    """An exponentially weighted mean of squared prequential residuals.

    After rows with squared residuals e_1..e_n (each scored by the model before the refit
    that trains on it), with decay d:
    total <- d^n total + sum_i d^(n-i) e_i and weight <- d^n weight + sum_i d^(n-i);
    the estimate is total / weight (bias-corrected: the first row's e_1 exactly; d = 1
    gives the plain mean).

    Attributes:
        total: the weighted sum of squared residuals.
        weight: the sum of the weights.
    """

    total: float = 0.0
    weight: float = 0.0

    def __post_init__(self) -> None:
        check_float("total", self.total, low=0.0)
        check_float("weight", self.weight, low=0.0)

    @property
    def variance(self) -> float | None:
        """total / weight; None before any row."""
        return self.total / self.weight if self.weight > 0 else None

    def updated(self, squared: Tensor, decay: float) -> Prequential:
        """This mean after the rows' squared residuals (N,), in row order."""
        check_float("decay", decay, low=0.0, high=1.0, low_open=True)
        n = int(squared.numel())
        if n == 0:
            return self
        powers = decay ** torch.arange(n - 1, -1, -1, dtype=torch.float64)  # (N,) d^(n-i)
        values = squared.detach().to("cpu", torch.float64).flatten()
        return Prequential(
            decay**n * self.total + float((powers * values).sum()),
            decay**n * self.weight + float(powers.sum()),
        )


@dataclass(frozen=True)
class RegulariserData:
    """What ROFU's regulariser needs from the logged data D.

    Attributes:
        sample: a uniform sample of D (all of D when small enough).
        n_total: |D|, the number of logged transitions the sample stands for.
        arm_counts: (A,) int64 pulls per arm over all of D; sums to `n_total`.
        noise: the served model's prequential squared residuals over D, from which
            `RofuConfig(noise="prequential")` takes sigma^2 (`rofu.models.scaling`);
            None: not tracked.
    """

    sample: Transitions
    n_total: int
    arm_counts: Tensor
    noise: Prequential | None = None

    def with_sample(self, sample: Transitions) -> RegulariserData:
        """The same |D|, counts and noise with another sample (moved or subset)."""
        return dataclasses.replace(self, sample=sample)

    def __post_init__(self) -> None:
        check_int("n_total", self.n_total, low=len(self.sample))
        counts = require_tensor("arm_counts", self.arm_counts)
        if counts.dtype != torch.int64 or counts.dim() != 1:
            raise TypeError("arm_counts must be a 1-d int64 tensor")
        if counts.numel() and int(counts.min()) < 0:
            raise ValueError("arm_counts must be non-negative")
        if int(counts.sum()) != self.n_total:
            raise ValueError(f"arm_counts sums to {int(counts.sum())}, n_total is {self.n_total}")
        if len(self.sample) and int(self.sample.arms.max()) >= counts.numel():
            raise ValueError("sample.arms has an arm index beyond arm_counts")
        if self.noise is not None and not isinstance(self.noise, Prequential):
            raise TypeError(f"noise must be a Prequential, got {type(self.noise).__name__}")


class DataBuffer:
    """A growable store of transitions with per-arm counts.

    `context_dim` is D for (D,) contexts, or a tuple, the shape of one context (an image's
    (C, H, W)). With `max_size`, it keeps a uniform reservoir sample (Vitter's algorithm R,
    drawn from `generator`) of at most `max_size` rows while `n_total` and the counts cover
    all data. With `window` W it keeps the last W rows instead: an older row leaves the
    sample, `n_total` and the counts (so the data D is the window; `n_seen` still counts
    every row appended). With `arm_feature_dim` F >= 1 every row carries its arm's (F,)
    features (`Transitions.features`), and every appended batch must carry them.
    """

    def __init__(
        self,
        context_dim: int | tuple[int, ...],
        *,
        max_size: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
        arm_feature_dim: int = 0,
        window: int | None = None,
    ) -> None:
        self.context_shape = as_context_shape("context_dim", context_dim)
        if max_size is not None:
            check_int("max_size", max_size, low=1)
        if window is not None:
            check_int("window", window, low=1)
            if max_size is not None and window > max_size:
                raise ValueError(f"window ({window}) must be at most max_size ({max_size})")
        self.arm_feature_dim = check_int("arm_feature_dim", arm_feature_dim, low=0)
        self.max_size = max_size
        self.window = window
        self._generator = generator or torch.Generator().manual_seed(0)
        self._x = torch.empty(0, *self.context_shape, dtype=dtype, device=device)
        self._arms = torch.empty(0, dtype=torch.int64, device=device)
        self._rewards = torch.empty(0, dtype=dtype, device=device)
        self._features = torch.empty(0, arm_feature_dim, dtype=dtype, device=device)
        self._start = 0  # a window's oldest held row
        self._size = 0
        self.n_total = 0
        self.n_seen = 0
        self.arm_counts = torch.zeros(0, dtype=torch.int64)
        self.noise: Prequential | None = None

    def __len__(self) -> int:
        return self._size

    @classmethod
    def restore(
        cls,
        data: RegulariserData,
        *,
        max_size: int | None = None,
        generator: torch.Generator | None = None,
        window: int | None = None,
    ) -> DataBuffer:
        """Continue a buffer from a checkpoint's sample, |D| and per-arm counts.

        Later appends keep the reservoir uniform over all |D| + new rows, because the
        acceptance probability uses the restored `n_total`. With a `window`, the sample's
        last `window` rows are kept and D becomes them (a sample that stands for more rows
        than it holds, a reservoir, has no order: its rows count as older than any new row).
        """
        sample = data.sample
        if max_size is not None and len(sample) > max_size:
            raise ValueError(f"data.sample has {len(sample)} rows, more than max_size={max_size}")
        buffer = cls(
            tuple(sample.x.shape[1:]),
            max_size=max_size,
            dtype=sample.x.dtype,
            device=sample.x.device,
            generator=generator,
            arm_feature_dim=0 if sample.features is None else sample.features.shape[1],
            window=window,
        )
        counts = data.arm_counts.clone()
        if window is not None and (data.n_total > len(sample) or len(sample) > window):
            sample = sample.subset(torch.arange(max(0, len(sample) - window), len(sample)))
            counts = torch.bincount(sample.arms.cpu(), minlength=counts.numel())
        if len(sample):
            buffer._put_rows(sample, len(sample))
        buffer.n_total = data.n_total if window is None else len(sample)
        buffer.n_seen = data.n_total
        buffer.arm_counts = counts
        buffer.noise = data.noise
        return buffer

    def score_residuals(self, squared: Tensor, decay: float) -> None:
        """Fold new rows' squared prequential residuals (N,) into `noise` (`Prequential`)."""
        self.noise = (self.noise or Prequential()).updated(squared, decay)

    def append(self, batch: Transitions) -> None:
        """Add transitions; once `max_size` rows are held, later rows enter the reservoir."""
        got = tuple(batch.x.shape[1:])
        if got != self.context_shape:
            got_text = got[0] if len(got) == 1 else got
            raise ValueError(
                f"batch.x must have {describe_contexts(self.context_shape)}, got {got_text}"
            )
        width = 0 if batch.features is None else batch.features.shape[1]
        if width != self.arm_feature_dim:
            raise ValueError(
                f"batch.features must have {self.arm_feature_dim} columns (0: none), got {width}"
            )
        self.n_seen += len(batch)
        if self.window is not None:
            self._append_window(batch, self.window)
            return
        self._count(batch.arms)
        bulk = len(batch)
        if self.max_size is not None:
            bulk = min(bulk, max(0, self.max_size - self._size))
        if bulk:
            self._put_rows(batch, bulk)
        for row in range(bulk, len(batch)):
            self._reservoir_put(batch, row)

    def _count(self, arms: Tensor, sign: int = 1) -> None:
        if arms.numel() == 0:
            return
        needed = int(arms.max()) + 1
        if needed > self.arm_counts.numel():
            grown = torch.zeros(needed, dtype=torch.int64)
            grown[: self.arm_counts.numel()] = self.arm_counts
            self.arm_counts = grown
        self.arm_counts += sign * torch.bincount(arms.cpu(), minlength=self.arm_counts.numel())

    def _append_window(self, batch: Transitions, window: int) -> None:
        """Add rows to a window: the batch's last `window` rows enter, the oldest held
        rows leave, and the counts follow."""
        if len(batch) > window:
            batch = batch.subset(torch.arange(len(batch) - window, len(batch)))
        leaving = self._size + len(batch) - window
        if leaving > 0:
            self._count(self._arms[self._start : self._start + leaving], sign=-1)
            self._start += leaving
            self._size -= leaving
            self.n_total -= leaving
        if self._start + self._size + len(batch) > 2 * window:  # compact: one copy per W rows
            held = slice(self._start, self._start + self._size)
            for name in ("_x", "_arms", "_rewards", "_features"):
                tensor = getattr(self, name)
                tensor[: self._size] = tensor[held].clone()
            self._start = 0
        self._count(batch.arms)
        self._put_rows(batch, len(batch))

    def _put_rows(self, batch: Transitions, rows: int) -> None:
        begin = self._start + self._size
        end = begin + rows
        if end > self._x.shape[0]:
            capacity = max(end, 2 * self._x.shape[0], 64)
            if self.max_size is not None:
                capacity = min(capacity, self.max_size)
            if self.window is not None:
                capacity = min(capacity, 2 * self.window)
            self._x = _resized(self._x, capacity)
            self._arms = _resized(self._arms, capacity)
            self._rewards = _resized(self._rewards, capacity)
            self._features = _resized(self._features, capacity)
        self._x[begin:end] = batch.x[:rows].to(self._x)
        self._arms[begin:end] = batch.arms[:rows].to(self._arms.device)
        self._rewards[begin:end] = batch.rewards[:rows].to(self._rewards)
        if batch.features is not None:
            self._features[begin:end] = batch.features[:rows].to(self._features)
        self._size += rows
        self.n_total += rows

    def _reservoir_put(self, batch: Transitions, row: int) -> None:
        self.n_total += 1
        slot = int(torch.randint(self.n_total, (1,), generator=self._generator))
        if self.max_size is not None and slot < self.max_size:
            self._x[slot] = batch.x[row].to(self._x)
            self._arms[slot] = batch.arms[row].to(self._arms.device)
            self._rewards[slot] = batch.rewards[row].to(self._rewards)
            if batch.features is not None:
                self._features[slot] = batch.features[row].to(self._features)

    def view(self) -> Transitions:
        """The stored rows (all data, the reservoir sample, or the window, oldest first)."""
        held = slice(self._start, self._start + self._size)
        features = self._features[held] if self.arm_feature_dim else None
        return Transitions(self._x[held], self._arms[held], self._rewards[held], features)

    def regulariser_data(self, n_arms: int | None = None) -> RegulariserData:
        """The stored rows with |D| and per-arm counts padded to `n_arms` arms."""
        counts = self.arm_counts
        if n_arms is not None and n_arms > counts.numel():
            counts = torch.cat([counts, torch.zeros(n_arms - counts.numel(), dtype=torch.int64)])
        return RegulariserData(self.view(), self.n_total, counts.clone(), self.noise)


def _resized(tensor: Tensor, rows: int) -> Tensor:
    out = torch.empty((rows, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    out[: tensor.shape[0]] = tensor
    return out
