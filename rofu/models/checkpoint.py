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
from collections.abc import Sequence
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
_CANDIDATE = "candidate/"


class CheckpointError(ValueError):
    """A checkpoint blob that cannot be trusted or does not fit; nothing was loaded."""


@dataclass(frozen=True)
class CandidateState:
    """One candidate as a checkpoint keeps it, so that the next refit continues it.

    Attributes:
        name: the candidate's name.
        net_config: its network's configuration (standardisation included).
        state: its network's state dict.
        loss: its prequential squared loss so far.
    """

    name: str
    net_config: RewardNetConfig
    state: dict[str, Tensor]
    loss: Prequential


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
        candidates: with a learner family (`rofu.models.learners`), every candidate's
            network and prequential loss (the served one's network is `state` too).
        served_learner: the candidate `state` is (None without a family).
    """

    version: int
    net_config: RewardNetConfig
    state: dict[str, Tensor]
    data: RegulariserData
    arm_features: Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)
    candidates: tuple[CandidateState, ...] = ()
    served_learner: str | None = None

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
    if checkpoint.candidates:
        tensors |= _candidate_tensors(checkpoint.candidates)
        metadata["candidates"] = json.dumps([_candidate_record(c) for c in checkpoint.candidates])
        metadata["served_learner"] = str(checkpoint.served_learner)
    metadata["checksum"] = _digest(tensors, metadata)
    return bytes(st_save(tensors, metadata=metadata))


def _candidate_tensors(candidates: tuple[CandidateState, ...]) -> dict[str, Tensor]:
    return {
        f"{_CANDIDATE}{c.name}/{name}": t.detach().cpu().clone()  # never shares `state`
        for c in candidates
        for name, t in c.state.items()
    }


def _candidate_record(candidate: CandidateState) -> dict[str, Any]:
    return {
        "name": candidate.name,
        "net_config": candidate.net_config.to_json(),
        "loss_total": repr(candidate.loss.total),
        "loss_weight": repr(candidate.loss.weight),
    }


def _candidates(tensors: dict[str, Tensor], metadata: dict[str, str]) -> tuple[CandidateState, ...]:
    """The learner family's candidates a checkpoint kept (none before families existed)."""
    if "candidates" not in metadata:
        return ()
    records: Any = json.loads(metadata["candidates"])
    if not isinstance(records, list):
        raise CheckpointError("checkpoint candidates must be a JSON list")
    kept = []
    for record in records:
        prefix = f"{_CANDIDATE}{record['name']}/"
        state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        loss = Prequential(float(record["loss_total"]), float(record["loss_weight"]))
        config = RewardNetConfig.from_json(record["net_config"])
        kept.append(CandidateState(str(record["name"]), config, state, loss))
    return tuple(kept)


def checkpoint_size_estimate(
    nets: Sequence[RewardNetConfig], sample_rows: int, max_arms: int
) -> int:
    """The bytes of the tensors a checkpoint of these networks holds, at 8 bytes an element
    (the widest dtype it stores), header and metadata aside.

    Args:
        nets: the network structures it may serve, one per candidate learner of a family
            (`rofu.models.learners`); the first gives the context and arm-feature widths.
        sample_rows: the most rows its data sample keeps.
        max_arms: the most arms (per-arm counts and catalogue features) it records.
    """
    if not nets:
        raise ValueError("nets must name at least one network structure")
    params = [sum(int(t.numel()) for t in net.build().state_dict().values()) for net in nets]
    served = max(params) + (sum(params) if len(params) > 1 else 0)  # theta and each candidate
    width = nets[0].arm_feature_dim
    row = nets[0].context_dim + width + 3  # (D,) context, (F,) features, arm, reward, slack
    return 8 * (served + sample_rows * row + max_arms * (width + 1))


def checkpoint_checksum(blob: bytes) -> str:
    """The checksum recorded in a blob's metadata (not verified; see `load_checkpoint`)."""
    return _metadata(blob).get("checksum", "")


def load_checkpoint(
    blob: bytes, expect: RewardNetConfig | Sequence[RewardNetConfig] | None = None
) -> Checkpoint:
    """Parse, verify and rebuild a checkpoint.

    Args:
        blob: bytes from `dump_checkpoint`.
        expect: when given, the network structure the caller serves, or the structures
            (one per candidate learner of a family, `rofu.models.learners`); a checkpoint
            of another structure (dims, arms, widths, activation) is refused.

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
    expected = (expect,) if isinstance(expect, RewardNetConfig) else tuple(expect or ())
    served = _structure(checkpoint.net_config)
    if expected and all(_structure(config) != served for config in expected):
        raise CheckpointError(
            f"checkpoint network {checkpoint.net_config.to_json()} does not match the "
            f"served structure {' or '.join(config.to_json() for config in expected)}"
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
        candidates=_candidates(tensors, metadata),
        served_learner=metadata.get("served_learner"),
    )


def _check_candidates(checkpoint: Checkpoint) -> None:
    """Raise ValueError when a kept candidate does not fit its own network or the served
    learner is not one of them."""
    names = [c.name for c in checkpoint.candidates]
    if len(set(names)) != len(names):
        raise ValueError(f"candidates repeat a name: {names}")
    if checkpoint.candidates and checkpoint.served_learner not in names:
        raise ValueError(f"served learner {checkpoint.served_learner!r} is not among {names}")
    for candidate in checkpoint.candidates:
        _check_finite(candidate.state, f"candidate {candidate.name}: ")
        RewardNet(candidate.net_config).load_state_dict(candidate.state, strict=True)


def _check_finite(state: dict[str, Tensor], what: str = "") -> None:
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{what}parameter {name} contains non-finite values")


def _check_fits(checkpoint: Checkpoint, net: RewardNet) -> None:
    """Raise ValueError when the data, arm features or kept candidates do not fit the
    network."""
    config, features = checkpoint.net_config, checkpoint.arm_features
    sample = checkpoint.data.sample
    _check_finite(checkpoint.state)
    _check_candidates(checkpoint)
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
