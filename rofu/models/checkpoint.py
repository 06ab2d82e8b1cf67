"""Checkpoints: theta, network config, the regulariser's data and counts, version, checksum.

The format is safetensors (no pickle anywhere). The checksum is a SHA-256 over every
tensor's name, dtype, shape and bytes and over the metadata, so a tampered, truncated or
corrupted blob is refused; loading builds everything anew and either returns a complete
checkpoint or raises `CheckpointError`, never leaving anything half-loaded.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

from rofu.models.data import Prequential, RegulariserData, Transitions
from rofu.models.networks import RewardNet, RewardNetConfig

FORMAT = "rofu-checkpoint"
FORMAT_VERSION = "1"
_PARAM = "param/"


class CheckpointError(ValueError):
    """A checkpoint blob that cannot be trusted or does not fit; nothing was loaded."""


@dataclass(frozen=True)
class Checkpoint:
    """A served model: everything ROFU scoring needs, and its provenance.

    Attributes:
        version: monotonically increasing model version.
        net_config: constructor arguments of the network.
        state: the network's state dict (theta).
        data: the regulariser's data sample, |D|, per-arm counts and the prequential
            noise (metadata `noise_total`/`noise_weight`, absent when not tracked); for an
            arm-feature network its rows may carry the arm features they were scored with.
            A standardising network's running statistics are buffers in `state`.
        arm_features: (A, F) arm features for an arm-feature network, else None.
        metrics: training metrics of the fit that produced theta.
        extra: caller-defined string fields (e.g. a trainer's high-water mark).
    """

    version: int
    net_config: RewardNetConfig
    state: dict[str, Tensor]
    data: RegulariserData
    arm_features: Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)

    def network(self) -> RewardNet:
        """A fresh network holding this checkpoint's parameters."""
        if not self.state:
            raise ValueError("checkpoint state holds no parameters")
        net = RewardNet(self.net_config)
        dtype = next(iter(self.state.values())).dtype
        net.to(dtype).load_state_dict(self.state, strict=True)
        return net


def dump_checkpoint(checkpoint: Checkpoint) -> bytes:
    """Serialise a checkpoint to safetensors bytes with an embedded checksum."""
    tensors = {_PARAM + name: t.detach().cpu().contiguous() for name, t in checkpoint.state.items()}
    sample = checkpoint.data.sample
    tensors |= {
        "data/x": sample.x.detach().cpu().contiguous(),
        "data/arms": sample.arms.cpu().contiguous(),
        "data/rewards": sample.rewards.detach().cpu().contiguous(),
        "data/arm_counts": checkpoint.data.arm_counts.cpu().contiguous(),
    }
    if sample.features is not None:
        tensors["data/features"] = sample.features.detach().cpu().contiguous()
    if checkpoint.arm_features is not None:
        tensors["arm_features"] = checkpoint.arm_features.detach().cpu().contiguous()
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "version": str(int(checkpoint.version)),
        "net_config": checkpoint.net_config.to_json(),
        "n_total": str(checkpoint.data.n_total),
        "metrics": json.dumps(checkpoint.metrics, sort_keys=True),
        "extra": json.dumps(checkpoint.extra, sort_keys=True),
    }
    noise = checkpoint.data.noise
    if noise is not None:
        metadata |= {"noise_total": repr(noise.total), "noise_weight": repr(noise.weight)}
    metadata["checksum"] = _digest(tensors, metadata)
    return bytes(st_save(tensors, metadata=metadata))


def checkpoint_checksum(blob: bytes) -> str:
    """The checksum recorded in a blob's metadata (not verified; see `load_checkpoint`)."""
    return _metadata(blob).get("checksum", "")


def load_checkpoint(blob: bytes, expect: RewardNetConfig | None = None) -> Checkpoint:
    """Parse, verify and rebuild a checkpoint.

    Args:
        blob: bytes from `dump_checkpoint`.
        expect: when given, the network structure the caller serves; a checkpoint of
            another structure (dims, arms, widths, activation) is refused.

    Raises:
        CheckpointError: on a truncated, corrupted, tampered or mismatched checkpoint.
    """
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise TypeError(f"blob must be bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    metadata = _metadata(blob)
    try:
        tensors = st_load(blob)
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"checkpoint tensors cannot be read: {exc}") from exc
    if metadata.get("format") != FORMAT or metadata.get("format_version") != FORMAT_VERSION:
        raise CheckpointError("not a rofu checkpoint of a supported format version")
    recorded = metadata.pop("checksum", None)
    if recorded != _digest(tensors, metadata):
        raise CheckpointError("checkpoint checksum does not match its contents")
    try:
        checkpoint = _rebuild(tensors, metadata)
        _check_fits(checkpoint, checkpoint.network())  # strict load: the state fits the config
    except CheckpointError:
        raise
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint contents are inconsistent: {exc}") from exc
    if expect is not None and _structure(expect) != _structure(checkpoint.net_config):
        raise CheckpointError(
            f"checkpoint network {checkpoint.net_config.to_json()} does not match the "
            f"served structure {expect.to_json()}"
        )
    return checkpoint


def _rebuild(tensors: dict[str, Tensor], metadata: dict[str, str]) -> Checkpoint:
    sample = Transitions(
        tensors["data/x"],
        tensors["data/arms"],
        tensors["data/rewards"],
        tensors.get("data/features"),
    )
    noise = None
    if "noise_total" in metadata:  # checkpoints before the noise was tracked have none
        noise = Prequential(float(metadata["noise_total"]), float(metadata["noise_weight"]))
    data = RegulariserData(sample, int(metadata["n_total"]), tensors["data/arm_counts"], noise)
    metrics: Any = json.loads(metadata["metrics"])
    extra: Any = json.loads(metadata["extra"])
    if not isinstance(metrics, dict) or not isinstance(extra, dict):
        raise CheckpointError("checkpoint metrics and extra must be JSON objects")
    state = {k[len(_PARAM) :]: v for k, v in tensors.items() if k.startswith(_PARAM)}
    return Checkpoint(
        version=int(metadata["version"]),
        net_config=RewardNetConfig.from_json(metadata["net_config"]),
        state=state,
        data=data,
        arm_features=tensors.get("arm_features"),
        metrics={str(k): float(v) for k, v in metrics.items()},
        extra={str(k): str(v) for k, v in extra.items()},
    )


def _check_fits(checkpoint: Checkpoint, net: RewardNet) -> None:
    """Raise ValueError when the data or arm features do not fit the network."""
    config, features = checkpoint.net_config, checkpoint.arm_features
    sample = checkpoint.data.sample
    for name, tensor in checkpoint.state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"parameter {name} contains non-finite values")
    if sample.x.shape[1] != config.context_dim:
        raise ValueError(
            f"data/x has {sample.x.shape[1]} features, the network {config.context_dim}"
        )
    if config.per_arm_outputs and features is not None:
        raise ValueError("arm_features stored for a network with one output per arm")
    if not config.per_arm_outputs and (
        features is None or features.dim() != 2 or features.shape[1] != config.arm_feature_dim
    ):
        raise ValueError(f"arm_features must have shape (A, {config.arm_feature_dim})")
    if sample.features is not None and (
        config.per_arm_outputs or sample.features.shape[1] != config.arm_feature_dim
    ):
        raise ValueError(f"data/features must have shape (N, {config.arm_feature_dim})")
    if len(sample) and int(sample.arms.max()) >= net.arm_count(features):
        raise ValueError("data/arms refers to an arm the network cannot score")


def _structure(config: RewardNetConfig) -> tuple[object, ...]:
    return (
        config.context_dim,
        config.n_arms,
        config.hidden,
        config.activation,
        config.arm_feature_dim,
        config.bias,
    )


def _metadata(blob: bytes) -> dict[str, str]:
    """The safetensors header's `__metadata__` (8-byte little-endian length, then JSON)."""
    if len(blob) < 8:
        raise CheckpointError(f"checkpoint is truncated ({len(blob)} bytes)")
    (size,) = struct.unpack("<Q", blob[:8])
    if size > len(blob) - 8:
        raise CheckpointError("checkpoint is truncated: header longer than the blob")
    try:
        header = json.loads(blob[8 : 8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError("checkpoint header is not valid JSON") from exc
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict):
        raise CheckpointError("checkpoint header has no metadata")
    return {str(k): str(v) for k, v in metadata.items()}


def _digest(tensors: dict[str, Tensor], metadata: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    body = {k: v for k, v in metadata.items() if k != "checksum"}
    digest.update(json.dumps(body, sort_keys=True).encode())
    return digest.hexdigest()
