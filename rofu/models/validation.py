"""Argument checks shared by the library; every error names the offending argument."""

from __future__ import annotations

import math
from collections.abc import Collection

import torch
from torch import Tensor


def require_tensor(name: str, value: object) -> Tensor:
    """Return `value` if it is a tensor, else raise TypeError naming `name`."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_float_tensor(
    name: str, value: object, *, ndim: int, size: dict[int, int] | None = None
) -> Tensor:
    """Check a finite floating tensor of `ndim` dims whose dim i has `size[i]` entries."""
    tensor = require_tensor(name, value)
    if not tensor.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {tensor.dtype}")
    _check_shape(name, tensor, ndim, size)
    if tensor.numel() and not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{name} contains non-finite values (NaN or infinity)")
    return tensor


def check_context_batch(name: str, value: object, shape: tuple[int, ...]) -> Tensor:
    """Check a finite floating (N, *shape) tensor: N contexts of `shape`."""
    size = {dim + 1: entries for dim, entries in enumerate(shape)}
    return check_float_tensor(name, value, ndim=1 + len(shape), size=size)


def as_context_shape(name: str, value: object) -> tuple[int, ...]:
    """A context shape from an int D (the shape (D,)) or a tuple of positive ints."""
    if isinstance(value, tuple) and value:
        return tuple(check_int(name, size, low=1) for size in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return (check_int(name, value, low=1),)
    raise TypeError(f"{name} must be an int or a non-empty tuple of ints, got {value!r}")


def describe_contexts(shape: tuple[int, ...]) -> str:
    """What a context of `shape` has, for error messages: `6 features`, `shape (3, 8, 8)`."""
    return f"{shape[0]} features" if len(shape) == 1 else f"shape {shape}"


def check_index_tensor(
    name: str, value: object, *, ndim: int, upper: int, size: dict[int, int] | None = None
) -> Tensor:
    """Check an integer tensor of `ndim` dims with every entry in [0, upper)."""
    tensor = require_tensor(name, value)
    if tensor.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"{name} must be an integer tensor, got {tensor.dtype}")
    _check_shape(name, tensor, ndim, size)
    if tensor.numel():
        low, high = int(tensor.min()), int(tensor.max())
        if low < 0 or high >= upper:
            raise ValueError(
                f"{name} has arm index {low if low < 0 else high}; valid: 0..{upper - 1}"
            )
    return tensor.long()


def check_mask_tensor(name: str, value: object, shape: tuple[int, ...]) -> Tensor:
    """Check a boolean mask of exactly `shape`."""
    tensor = require_tensor(name, value)
    if tensor.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor, got {tensor.dtype}")
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
    return tensor


def _check_shape(name: str, tensor: Tensor, ndim: int, size: dict[int, int] | None) -> None:
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(tensor.shape)}")
    for dim, expected in (size or {}).items():
        if tensor.shape[dim] != expected:
            raise ValueError(
                f"{name} must have {expected} entries in dim {dim}, got shape {tuple(tensor.shape)}"
            )


def check_int(name: str, value: object, *, low: int, high: int | None = None) -> int:
    """Check an int in [low, high]; bools are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check_float(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> float:
    """Check a finite real in [low, high] (or (low, high] when `low_open`)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value}")
    too_low = low is not None and (number <= low if low_open else number < low)
    if too_low or (high is not None and number > high):
        left = "(" if low_open else "["
        raise ValueError(f"{name} must be in {left}{low}, {high}], got {value}")
    return number


def check_choice(name: str, value: object, choices: Collection[str]) -> str:
    """Check that `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return str(value)
