"""Named features hashed into dense vectors: the hash, every value type, and refusals.

The golden values come from outside this implementation: MurmurHash3_x86_32's published
test vectors (SMHasher's verification strings), and entry indices computed with the
reference C code of aappleby/smhasher (`MurmurHash3.cpp`, compiled with gcc), hashing the
namespace with the seed and the entry name with the namespace's hash.
"""

from __future__ import annotations

import pytest

from rofu.service.deciding.features import (
    FeatureError,
    entry_index,
    featurize,
    murmur3_32,
    named_entries,
    normalise,
    to_vector,
)


@pytest.mark.parametrize(
    ("data", "seed", "expected"),
    [
        (b"", 0, 0x00000000),
        (b"", 1, 0x514E28B7),
        (b"", 0xFFFFFFFF, 0x81F16F39),
        (b"\x00\x00\x00\x00", 0, 0x2362F9DE),
        (b"aaaa", 0x9747B28C, 0x5A97808A),
        (b"abc", 0, 0xB3DD93FA),
        (b"hello", 0, 0x248BFA47),
        (b"Hello, world!", 0x9747B28C, 0x24884CBA),
        (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
    ],
)
def test_murmur3_32_matches_the_reference_vectors(data: bytes, seed: int, expected: int) -> None:
    assert murmur3_32(data, seed) == expected


def test_murmur3_32_refuses_a_seed_outside_32_bits() -> None:
    with pytest.raises(ValueError, match="seed"):
        murmur3_32(b"x", 2**32)


# (seed, namespace, entry name, dim) -> index, from the reference C implementation:
# h_ns = MurmurHash3_x86_32(namespace, seed); index = MurmurHash3_x86_32(name, h_ns) % dim
GOLDEN = [
    (0, "user", "age", 8, 7),  # h_ns 0x95943d0d, h 0x4ac45c0f
    (0, "user", "country=fr", 8, 3),  # h 0xcea56013
    (0, "user", "tags=a", 8, 7),  # h 0xd21abfcf
    (0, "user", "tags=b", 8, 2),  # h 0xb2d4566a
    (0, "device", "mobile", 8, 5),  # h_ns 0x048ebb27, h 0x6e471875
    (0, "", "hour", 8, 5),  # the default namespace: h_ns 0, h 0x1a9ed795
    (7, "user", "age", 8, 1),  # h_ns 0xd169d74c, h 0x804f9169
    (7, "user", "country=fr", 1000, 493),  # h 0x18038b75
    (0, "user", "scores[1]", 16, 2),  # h 0x6ba2eda2
    (42, "ns", "ünïcode=é", 100, 10),  # UTF-8: h_ns 0x2d1d6dfa, h 0xa46618aa
]


@pytest.mark.parametrize(("seed", "namespace", "name", "dim", "index"), GOLDEN)
def test_entry_index_matches_the_reference_implementation(
    seed: int, namespace: str, name: str, dim: int, index: int
) -> None:
    assert entry_index(namespace, name, dim, seed) == index


def test_featurize_hashes_the_readme_example_and_sums_collisions() -> None:
    context = {
        "user": {"age": 31, "country": "fr", "tags": ["a", "b"]},
        "device": {"mobile": True},
    }
    # age -> 7 (31), country=fr -> 3, tags=a -> 7 (collides with age), tags=b -> 2,
    # mobile -> 5: index 7 holds 31 + 1.
    assert featurize(context, 8, 0) == [0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 32.0]


def test_featurize_gives_each_value_type_its_entries() -> None:
    context = {
        "n": {"weight": 2.5, "zero": 0, "int": 3},
        "b": {"yes": True, "no": False},
        "s": {"colour": "red"},
        "l": {"tags": ["x", "x", "y"], "scores": [0.5, 0.0, -1.5], "empty": []},
        "absent": None,
        "hour": 13,
    }
    entries = {(e.namespace, e.name): e.weight for e in named_entries(context)}
    assert entries == {
        ("n", "weight"): 2.5,
        ("n", "int"): 3.0,
        ("b", "yes"): 1.0,
        ("s", "colour=red"): 1.0,
        ("l", "tags=x"): 1.0,  # twice: repeats add up in the vector
        ("l", "tags=y"): 1.0,
        ("l", "scores[0]"): 0.5,
        ("l", "scores[2]"): -1.5,
        ("", "hour"): 13.0,
    }
    assert len(named_entries(context)) == 10  # tags=x counted twice
    vector = featurize({"l": {"tags": ["x", "x"]}}, 16, 3)
    assert vector[entry_index("l", "tags=x", 16, 3)] == 2.0
    assert sum(vector) == 2.0


def test_featurize_is_independent_of_key_order_and_stable_across_calls() -> None:
    one = {"user": {"age": 31, "country": "fr"}, "device": {"mobile": True}, "hour": 2}
    two = {"hour": 2, "device": {"mobile": True}, "user": {"country": "fr", "age": 31}}
    assert featurize(one, 64, 5) == featurize(two, 64, 5)
    assert normalise(one) == normalise(two)


def test_featurize_depends_on_the_seed_and_the_namespace() -> None:
    assert featurize({"user": {"age": 1}}, 1024, 0) != featurize({"user": {"age": 1}}, 1024, 7)
    assert featurize({"user": {"age": 1}}, 1024, 0) != featurize({"item": {"age": 1}}, 1024, 0)


def test_normalise_makes_every_number_a_float() -> None:
    assert normalise({"a": {"n": 31, "l": [1, 2]}, "b": "x", "c": True}) == {
        "a": {"n": 31.0, "l": [1.0, 2.0]},
        "b": "x",
        "c": True,
    }


@pytest.mark.parametrize(
    ("context", "field", "reason"),
    [
        ({"user": {"address": {"city": "x"}}}, "context.user.address", "do not nest"),
        ({"user": {"tags": ["a", 1]}}, "context.user.tags.1", "a number among strings"),
        ({"user": {"tags": [1, "a"]}}, "context.user.tags.1", "a string among numbers"),
        ({"user": {"tags": [True]}}, "context.user.tags.0", "not a boolean"),
        ({"user": {"tags": [[1]]}}, "context.user.tags.0", "not a list"),
        ({"user": {"age": float("nan")}}, "context.user.age", "not a finite"),
        ({"user": {"age": 10**400}}, "context.user.age", "too large for float32"),
        ({"age": 1e39}, "context.age", "not a finite float32"),
        ({"user": {"": 1}}, "context.user.''", "non-empty"),
    ],
)
def test_featurize_refuses_naming_the_offending_key(
    context: dict[str, object], field: str, reason: str
) -> None:
    with pytest.raises(FeatureError, match=reason) as refused:
        featurize(context, 8, 0)
    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field}: ")


def test_featurize_bounds_each_feature_and_each_summed_index() -> None:
    with pytest.raises(FeatureError, match="beyond the bound") as single:
        featurize({"user": {"age": 200.0}}, 8, 0, max_abs=100.0)
    assert single.value.field == "context.user.age"
    # age (index 7) and tags=a (index 7) collide: 99 + 1 = 100 is fine, 99.5 + 1 is not.
    assert featurize({"user": {"age": 99.0, "tags": ["a"]}}, 8, 0, max_abs=100.0)[7] == 100.0
    with pytest.raises(FeatureError, match="user.age, user.tags.0 hash to index 7") as summed:
        featurize({"user": {"age": 99.5, "tags": ["a"]}}, 8, 0, max_abs=100.0)
    assert summed.value.field == "context"


def test_to_vector_checks_a_dense_list_and_hashes_a_named_object() -> None:
    assert to_vector([1, 2.5], 2, 0, max_abs=10.0) == [1.0, 2.5]
    with pytest.raises(FeatureError, match="expected 3 values, got 2") as short:
        to_vector([1.0, 2.0], 3, 0, max_abs=10.0)
    assert short.value.field == "context"
    with pytest.raises(FeatureError, match="beyond the bound") as far:
        to_vector([1.0, 20.0], 2, 0, max_abs=10.0, path="arm_features.arm-1")
    assert far.value.field == "arm_features.arm-1.1"
    assert to_vector({"p": {"x": 1.0}}, 4, 0, max_abs=10.0) == featurize({"p": {"x": 1.0}}, 4, 0)
