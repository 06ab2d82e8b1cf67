"""Checkpoints: lossless round trips, safetensors without pickle, and refusal of bad blobs."""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rofu.models import (
    Checkpoint,
    CheckpointError,
    RegulariserData,
    RewardNetConfig,
    dump_checkpoint,
    load_checkpoint,
)
from rofu.models.checkpoint import _digest, checkpoint_checksum
from tests.factories import arm_features, make_data, make_net

NET = RewardNetConfig(context_dim=6, n_arms=4, hidden=(5,), seed=3)


def _checkpoint(
    *,
    form: str = "per-arm",
    dtype: torch.dtype = torch.float32,
    metrics: dict[str, float] | None = None,
    extra: dict[str, str] | None = None,
) -> Checkpoint:
    if form == "per-arm":
        net = make_net(6, 4, hidden=(5,), seed=3, dtype=dtype)
        features = None
    else:
        net = make_net(6, hidden=(5,), arm_feature_dim=2, seed=3, dtype=dtype)
        features = arm_features(4, 2).to(dtype)
    data = make_data(12, 6, 4, n_total=40, dtype=dtype)
    return Checkpoint(
        version=7,
        net_config=net.config,
        state={k: v.clone() for k, v in net.state_dict().items()},
        data=data,
        arm_features=features,
        metrics={"loss": 0.125, "steps": 100.0} if metrics is None else metrics,
        extra={"high_water": "1234", "note": "ünïcode ✓"} if extra is None else extra,
    )


def _header(blob: bytes) -> tuple[int, dict]:
    (size,) = struct.unpack("<Q", blob[:8])
    return size, json.loads(blob[8 : 8 + size])


def _assert_same(got: Checkpoint, want: Checkpoint) -> None:
    assert got.version == want.version
    assert got.net_config == want.net_config
    assert got.state.keys() == want.state.keys()
    for name, tensor in want.state.items():
        assert got.state[name].dtype == tensor.dtype, name
        assert torch.equal(got.state[name], tensor), name  # bitwise for floats without NaN
    for field in ("x", "arms", "rewards"):
        got_t, want_t = getattr(got.data.sample, field), getattr(want.data.sample, field)
        assert got_t.dtype == want_t.dtype, field
        assert torch.equal(got_t, want_t), field
    assert got.data.n_total == want.data.n_total
    assert torch.equal(got.data.arm_counts, want.data.arm_counts)
    if want.arm_features is None:
        assert got.arm_features is None
    else:
        assert got.arm_features is not None
        assert torch.equal(got.arm_features, want.arm_features)
    assert got.metrics == want.metrics
    assert got.extra == want.extra


# --- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["per-arm", "arm-feature"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_checkpoint_round_trip_preserves_everything(form, dtype):
    checkpoint = _checkpoint(form=form, dtype=dtype)
    blob = dump_checkpoint(checkpoint)
    assert isinstance(blob, bytes)
    _assert_same(load_checkpoint(blob), checkpoint)
    _assert_same(load_checkpoint(bytearray(blob)), checkpoint)
    _assert_same(load_checkpoint(memoryview(blob)), checkpoint)


def test_checkpoint_round_trip_of_empty_metrics_and_extra():
    checkpoint = _checkpoint(metrics={}, extra={})
    _assert_same(load_checkpoint(dump_checkpoint(checkpoint)), checkpoint)


def test_checkpoint_round_trip_is_bitwise_for_awkward_floats():
    checkpoint = _checkpoint(dtype=torch.float64)
    state = dict(checkpoint.state)
    # Built in float64 directly: through float32 the max double would become inf.
    special = torch.tensor(
        [5e-324, -0.0, 1.0 + 2**-52, 1.7976931348623157e308], dtype=torch.float64
    )
    state["layers.1.bias"] = special.clone()
    odd = dataclasses.replace(checkpoint, state=state, metrics={"tiny": 5e-324, "big": 1e300})
    back = load_checkpoint(dump_checkpoint(odd))
    bits = back.state["layers.1.bias"].view(torch.int64)
    assert torch.equal(bits, special.view(torch.int64))
    assert back.metrics == {"tiny": 5e-324, "big": 1e300}


def test_checkpoint_dump_is_deterministic_in_content():
    # safetensors may order the metadata differently; the checksum covers the contents.
    first, second = dump_checkpoint(_checkpoint()), dump_checkpoint(_checkpoint())
    assert checkpoint_checksum(first) == checkpoint_checksum(second)
    assert len(first) == len(second)
    assert first[_header(first)[0] + 8 :] == second[_header(second)[0] + 8 :], "tensor bytes"


def test_checkpoint_network_is_a_fresh_copy_of_the_saved_network():
    net = make_net(6, 4, hidden=(5,), seed=3, dtype=torch.float64)
    with torch.no_grad():
        net.layers[0].weight.mul_(3.0)  # trained away from the seeded initialisation
    checkpoint = dataclasses.replace(_checkpoint(dtype=torch.float64), state=net.state_dict())
    restored = load_checkpoint(dump_checkpoint(checkpoint)).network()
    assert restored is not net
    assert all(p.dtype == torch.float64 for p in restored.parameters())
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(restored.score_all(x), net.score_all(x), rtol=0, atol=0)
    with torch.no_grad():
        restored.layers[0].weight.zero_()
    assert bool(net.layers[0].weight.ne(0).any()), "no storage is shared with the original"


# --- the format -----------------------------------------------------------------------------


def test_checkpoint_blob_is_a_safetensors_file_with_metadata():
    checkpoint = _checkpoint(form="arm-feature")
    blob = dump_checkpoint(checkpoint)
    size, header = _header(blob)
    assert size + 8 <= len(blob)
    metadata = header["__metadata__"]
    assert metadata["format"] == "rofu-checkpoint"
    assert metadata["version"] == "7"
    assert metadata["n_total"] == "40"
    assert RewardNetConfig.from_json(metadata["net_config"]) == checkpoint.net_config
    assert len(metadata["checksum"]) == 64
    tensors = st_load(blob)  # a plain safetensors reader understands it
    assert set(tensors) == {f"param/{k}" for k in checkpoint.state} | {
        "data/x",
        "data/arms",
        "data/rewards",
        "data/arm_counts",
        "arm_features",
    }


def test_checkpoint_loads_without_pickle(monkeypatch):
    import pickle

    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("pickle was used")

    blob = dump_checkpoint(_checkpoint())
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    _assert_same(load_checkpoint(blob), _checkpoint())
    assert b"\x80\x04" not in blob[:8], "no pickle protocol marker at the start"


def test_checkpoint_checksum_returns_the_recorded_checksum():
    blob = dump_checkpoint(_checkpoint())
    _, header = _header(blob)
    assert checkpoint_checksum(blob) == header["__metadata__"]["checksum"]
    other = dump_checkpoint(dataclasses.replace(_checkpoint(), version=8))
    assert checkpoint_checksum(other) != checkpoint_checksum(blob)
    with pytest.raises(CheckpointError):
        checkpoint_checksum(b"nope")


# --- corrupted, truncated and foreign blobs -------------------------------------------------


@pytest.fixture(scope="module")
def blob() -> bytes:
    return dump_checkpoint(_checkpoint(form="arm-feature"))


def _regions(blob: bytes) -> dict[str, range]:
    size, parsed = _header(blob)
    header = blob[8 : 8 + size]
    meta = header.index(b'"__metadata__"')
    # the metadata object ends where the first tensor entry begins
    end = min(header.index(f'"{name}":{{"dtype"'.encode()) for name in parsed if name[0] != "_")
    assert meta < end
    return {
        "length prefix": range(0, 8),
        "header": range(8, 8 + size),
        "metadata": range(8 + meta, 8 + end),
        "tensor data": range(8 + size, len(blob)),
    }


@pytest.mark.parametrize("region", ["length prefix", "header", "metadata", "tensor data"])
def test_checkpoint_single_byte_flips_are_refused(blob, region):
    positions = _regions(blob)[region]
    assert len(positions) >= 8
    for position in positions:  # every byte of the region
        for mask in (0x01, 0x80):
            broken = bytearray(blob)
            broken[position] ^= mask
            with pytest.raises(CheckpointError):
                load_checkpoint(bytes(broken))


def test_checkpoint_truncations_are_refused(blob):
    for length in range(len(blob)):  # every proper prefix, empty included
        with pytest.raises(CheckpointError):
            load_checkpoint(blob[:length])


def test_checkpoint_trailing_bytes_are_refused(blob):
    with pytest.raises(CheckpointError):
        load_checkpoint(blob + b"\x00" * 8)


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\x00" * 7,
        b"\x00" * 64,
        b"\xff" * 64,
        struct.pack("<Q", 2) + b"{}",
        struct.pack("<Q", 4) + b"[1] ",
        struct.pack("<Q", 2) + b"\xc3\x28",
        struct.pack("<Q", 24) + b'{"__metadata__": {}}    ',
        b"PK\x03\x04 a zip file, like torch.save writes",
    ],
)
def test_checkpoint_garbage_is_refused(garbage):
    with pytest.raises(CheckpointError):
        load_checkpoint(garbage)


def test_checkpoint_torch_save_output_is_refused(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(make_net().state_dict(), path)
    with pytest.raises(CheckpointError):
        load_checkpoint(path.read_bytes())


@pytest.mark.parametrize("value", ["a string", None, 123, [b"\x00"], bytes])
def test_checkpoint_load_refuses_non_bytes(value):
    with pytest.raises(TypeError, match="blob must be bytes"):
        load_checkpoint(value)  # type: ignore[arg-type]


def test_checkpoint_error_is_a_value_error():
    assert issubclass(CheckpointError, ValueError)


# --- expected structure ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"context_dim": 7},
        {"n_arms": 5},
        {"hidden": (6,)},
        {"hidden": (5, 5)},
        {"activation": "tanh"},
        {"bias": False},
        {"n_arms": 0, "arm_feature_dim": 2},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_checkpoint_expect_refuses_another_structure(change):
    blob = dump_checkpoint(_checkpoint())
    with pytest.raises(CheckpointError, match="does not match"):
        load_checkpoint(blob, expect=dataclasses.replace(NET, **change))


@pytest.mark.parametrize(
    "change", [{}, {"seed": 99}, {"dropout": 0.2}, {"init_scale": 0.3}, {"seed": 0, "dropout": 0.5}]
)
def test_checkpoint_expect_accepts_the_same_structure(change):
    checkpoint = _checkpoint()
    got = load_checkpoint(dump_checkpoint(checkpoint), expect=dataclasses.replace(NET, **change))
    assert got.net_config == checkpoint.net_config, "the checkpoint's own config is returned"


# --- tampering and inconsistent contents ----------------------------------------------------


def _resave(blob: bytes, tensors=None, metadata=None, *, sign: bool) -> bytes:
    """Rewrite a blob's tensors and metadata (a None value drops the key); `sign` records a
    correct checksum of the new contents, computed as the library does."""
    _, header = _header(blob)
    changed = dict(header["__metadata__"]) | (metadata or {})
    meta = {k: v for k, v in changed.items() if v is not None}
    old = st_load(blob)
    new = old if tensors is None else tensors(dict(old))
    if sign:
        meta["checksum"] = _digest(new, meta)
    return bytes(st_save(new, metadata=meta))


def test_checkpoint_resave_helper_round_trips(blob):
    assert load_checkpoint(_resave(blob, sign=True)).version == 7
    assert load_checkpoint(_resave(blob, sign=False)).version == 7


def _scaled_param(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    tensors["param/layers.0.weight"] = tensors["param/layers.0.weight"] * 2
    return tensors


@pytest.mark.parametrize(
    ("tensors", "metadata"),
    [
        (_scaled_param, None),
        (None, {"version": "8"}),
        (None, {"n_total": "41"}),
        (None, {"metrics": '{"loss": 0.0}'}),
        (None, {"extra": "{}"}),
        (None, {"net_config": RewardNetConfig(6, arm_feature_dim=2, hidden=(5,)).to_json()}),
    ],
    ids=["parameter", "version", "n_total", "metrics", "extra", "net_config"],
)
def test_checkpoint_tampering_with_the_old_checksum_is_refused(blob, tensors, metadata):
    tampered = _resave(blob, tensors, metadata, sign=False)
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(tampered)


def test_checkpoint_tampering_resigned_with_a_wrong_checksum_is_refused(blob):
    # An attacker re-signs with a checksum of the original contents, or any made-up one.
    original = checkpoint_checksum(blob)
    for checksum in (original, "0" * 64, "", original.upper()):
        tampered = _resave(blob, _scaled_param, {"checksum": checksum}, sign=False)
        with pytest.raises(CheckpointError, match="checksum"):
            load_checkpoint(tampered)


def test_checkpoint_missing_checksum_is_refused(blob):
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(_resave(blob, None, {"checksum": None}, sign=False))


@pytest.mark.parametrize(
    "metadata", [{"format": "other"}, {"format_version": "2"}], ids=["format", "version"]
)
def test_checkpoint_foreign_format_is_refused_even_when_signed(blob, metadata):
    with pytest.raises(CheckpointError, match="format"):
        load_checkpoint(_resave(blob, None, metadata, sign=True))


def _wrong_shape(t):
    return t | {"param/layers.0.weight": torch.zeros(5, 9)}


def _missing_param(t):
    return {k: v for k, v in t.items() if k != "param/layers.1.bias"}


def _extra_param(t):
    return t | {"param/layers.2.weight": torch.zeros(1, 5)}


def _no_params(t):
    return {k: v for k, v in t.items() if not k.startswith("param/")}


def _counts_off(t):
    return t | {"data/arm_counts": t["data/arm_counts"] + 1}


def _no_rewards(t):
    return {k: v for k, v in t.items() if k != "data/rewards"}


def _arms_as_float(t):
    return t | {"data/arms": t["data/arms"].double()}


def _sample_too_wide(t):
    return t | {"data/x": torch.zeros(12, 7, dtype=t["data/x"].dtype)}


def _features_too_wide(t):
    return t | {"arm_features": torch.zeros(4, 3, dtype=t["arm_features"].dtype)}


def _no_features(t):
    return {k: v for k, v in t.items() if k != "arm_features"}


INCONSISTENT = [
    ("parameter of the wrong shape", _wrong_shape, None),
    ("missing parameter", _missing_param, None),
    ("unexpected parameter", _extra_param, None),
    ("no parameters at all", _no_params, None),
    ("counts do not sum to n_total", _counts_off, None),
    ("missing data tensor", _no_rewards, None),
    ("float arm indices", _arms_as_float, None),
    ("data sample of another width", _sample_too_wide, None),
    ("arm features of another width", _features_too_wide, None),
    ("arm-feature network without arm features", _no_features, None),
    ("n_total not a number", None, {"n_total": "many"}),
    ("version not a number", None, {"version": "v7"}),
    ("metrics not an object", None, {"metrics": "[1, 2]"}),
    ("metrics not numbers", None, {"metrics": '{"loss": "low"}'}),
    ("extra not JSON", None, {"extra": "{"}),
    ("net_config unknown field", None, {"net_config": '{"context_dim": 6, "depth": 2}'}),
    ("net_config invalid", None, {"net_config": NET.to_json().replace("relu", "swish")}),
    ("metadata key missing", None, {"metrics": None}),
]


@pytest.mark.parametrize(
    ("case", "tensors", "metadata"), INCONSISTENT, ids=[c[0] for c in INCONSISTENT]
)
def test_checkpoint_signed_but_inconsistent_is_refused(blob, case, tensors, metadata):
    tampered = _resave(blob, tensors, metadata, sign=True)
    with pytest.raises(CheckpointError, match="inconsistent|JSON objects") as info:
        load_checkpoint(tampered)
    assert "checksum" not in str(info.value), "the checksum was right; the contents are not"


def test_checkpoint_of_a_state_that_does_not_fit_the_config_is_refused():
    # Built by the library itself: the state of one network with the config of another.
    checkpoint = _checkpoint()
    other = make_net(6, 4, hidden=(7,)).state_dict()
    blob = dump_checkpoint(dataclasses.replace(checkpoint, state=other))
    with pytest.raises(CheckpointError, match="inconsistent"):
        load_checkpoint(blob)


def test_checkpoint_refuses_regulariser_data_with_arms_beyond_the_network():
    checkpoint = _checkpoint()  # per-arm network with 4 arms
    data = make_data(12, 6, 6, n_total=40)
    data = RegulariserData(data.sample.to("cpu", torch.float32), 40, data.arm_counts)
    blob = dump_checkpoint(dataclasses.replace(checkpoint, data=data))
    with pytest.raises(CheckpointError, match="inconsistent"):
        load_checkpoint(blob)


def test_checkpoint_refuses_arm_features_stored_for_a_per_arm_network():
    checkpoint = dataclasses.replace(_checkpoint(), arm_features=arm_features(4, 2).float())
    with pytest.raises(CheckpointError, match="inconsistent.*arm_features"):
        load_checkpoint(dump_checkpoint(checkpoint))
