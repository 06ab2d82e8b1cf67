"""Features the way users have them: named, namespaced features hashed into a dense vector.

A context (or an arm's per-request features) is either a dense list of exactly `dim`
numbers, used as it is, or a *named context*: a JSON object in the Vowpal Wabbit style,

    {"user": {"age": 31, "country": "fr", "tags": ["a", "b"]},
     "device": {"mobile": true},
     "hour": 13}

Each key of the object is a **namespace** when its value is an object (of named
features), and otherwise a feature of the **default namespace**, whose name is the empty
string "" (so `"hour": 13` above is feature `hour` of namespace ""). Objects nest no
deeper: a namespace's values are never objects. Names (of namespaces and of features) are
non-empty strings. An empty object is a context without features (every entry 0).

A feature's value becomes zero or more hashed entries, each a (name, weight) pair:

    number v              name              weight v        (v = 0 adds nothing)
    true / false          name              weight 1 / nothing
    string s              name=s            weight 1        (one-hot)
    [s0, s1, ...] strings name=s0, name=s1  weight 1 each   (repeats add up)
    [v0, v1, ...] numbers name[0], name[1]  weights v0, v1
    [] or null            nothing (the feature is absent)

A list mixes no types; booleans and objects are not list items. The entry names are
plain text, so `{"a": "b=c"}` and `{"a=b": "c"}` share the entry `a=b=c`, as in VW.

**The hash** (stable across processes, machines and Python versions; a client can
reproduce it): with `murmur3_32(data, seed)` MurmurHash3's x86 32-bit variant (Austin
Appleby's `MurmurHash3_x86_32`, unsigned result), `seed` the `ROFU_FEATURE_HASH_SEED`
setting (default 0) and UTF-8 encoding,

    h_ns  = murmur3_32(namespace, seed)        # "" for the default namespace
    h     = murmur3_32(entry name, h_ns)
    index = h mod dim
    x[index] += weight

Entries that collide in an index add up. For example, with seed 0 and dim 8,
`{"user": {"country": "fr"}}` is x[3] = 1: murmur3_32(b"user", 0) = 0x95943d0d,
murmur3_32(b"country=fr", 0x95943d0d) = 0xcea56013, and 0xcea56013 mod 8 = 3
(tests/unit/test_features.py pins more, checked against the reference C code).

Public API (used by `/v1/select` and by anything that accepts user features):

- `to_vector(value, dim, seed, *, max_abs, path)`: a dense list or a named object to the
  dense vector of `dim` floats, validated; the main entry point.
- `featurize(context, dim, seed, *, max_abs=None, path="context")`: a named object to
  its hashed vector.
- `named_entries(context, *, path="context")`: the validated (namespace, name, weight)
  entries of a named object, before hashing.
- `normalise(context, *, path="context")`: a named object validated, numbers as floats
  (what a request stores and what its idempotency digest covers).
- `entry_index(namespace, name, dim, seed)` and `murmur3_32(data, seed)`: the hash.
- `FeatureError`: every refusal, with `field`, the dotted path of the offending value
  (`context.user.age`), and `loc`, that path below the root.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

DEFAULT_NAMESPACE = ""
FLOAT32_MAX = 3.4028234663852886e38  # a feature goes through the network in float32
_MASK = 0xFFFFFFFF

Loc = tuple[str | int, ...]


class FeatureError(ValueError):
    """A value that cannot be a feature; `field` names it (`context.user.age`)."""

    def __init__(self, reason: str, loc: Loc = (), *, root: str = "context") -> None:
        self.reason, self.loc, self.root = reason, loc, root
        self.field = ".".join(str(part) for part in (root, *loc) if part != "")
        super().__init__(f"{self.field}: {reason}")


@dataclass(frozen=True)
class Entry:
    """One hashed entry of a named context: where it came from, its name and weight."""

    loc: Loc  # the feature's path below the root, for messages
    namespace: str
    name: str  # `age`, `country=fr`, `tags[0]`
    weight: float

    def index(self, dim: int, seed: int) -> int:
        """Where this entry lands in a vector of `dim` entries."""
        return entry_index(self.namespace, self.name, dim, seed)


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 of `data` with `seed` (0 <= seed < 2**32), as an unsigned int."""
    if not 0 <= seed <= _MASK:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    h = seed
    blocks = len(data) // 4
    for k in struct.unpack_from(f"<{blocks}I", data):
        k = (k * 0xCC9E2D51) & _MASK
        k = (((k << 15) | (k >> 17)) * 0x1B873593) & _MASK
        h ^= k
        h = ((((h << 13) | (h >> 19)) & _MASK) * 5 + 0xE6546B64) & _MASK
    rest = data[4 * blocks :]
    if rest:
        k = (int.from_bytes(rest, "little") * 0xCC9E2D51) & _MASK
        h ^= (((k << 15) | (k >> 17)) * 0x1B873593) & _MASK
    h ^= len(data)
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & _MASK
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & _MASK
    return h ^ (h >> 16)


@lru_cache(maxsize=4096)
def _namespace_hash(namespace: str, seed: int) -> int:
    return murmur3_32(namespace.encode("utf-8"), seed)


def entry_index(namespace: str, name: str, dim: int, seed: int) -> int:
    """The index of entry `name` of `namespace` in a vector of `dim` entries."""
    return murmur3_32(name.encode("utf-8"), _namespace_hash(namespace, seed)) % dim


def to_vector(
    value: Sequence[float] | Mapping[str, object],
    dim: int,
    seed: int,
    *,
    max_abs: float,
    path: str = "context",
) -> list[float]:
    """A dense list (exactly `dim` numbers) or a named object as `dim` floats.

    Raises:
        FeatureError: a list of another length, a value beyond +-`max_abs`
            (`ROFU_MAX_ABS_FEATURE`) or a malformed named object; `field` names it.
    """
    if isinstance(value, Mapping):
        return featurize(value, dim, seed, max_abs=max_abs, path=path)
    if len(value) != dim:
        raise FeatureError(f"expected {dim} values, got {len(value)}", root=path)
    for index, number in enumerate(value):
        if abs(number) > max_abs:
            raise FeatureError(_beyond(number, max_abs), (index,), root=path)
    return [float(number) for number in value]


def featurize(
    context: Mapping[str, object],
    dim: int,
    seed: int,
    *,
    max_abs: float | None = None,
    path: str = "context",
) -> list[float]:
    """The hashed vector of `dim` floats of a named object (see the module docstring).

    With `max_abs`, every entry's weight and every summed index must lie within it; an
    index whose colliding entries sum beyond it names them.

    Raises:
        FeatureError: a malformed named object or a value beyond the bound.
    """
    vector = [0.0] * dim
    sources: dict[int, list[Entry]] = {}
    for entry in named_entries(context, path=path):
        if max_abs is not None and abs(entry.weight) > max_abs:
            raise FeatureError(_beyond(entry.weight, max_abs), entry.loc, root=path)
        index = entry.index(dim, seed)
        vector[index] += entry.weight
        sources.setdefault(index, []).append(entry)
    if max_abs is not None:
        for index, total in enumerate(vector):
            if abs(total) > max_abs:
                names = ", ".join(sorted({_dotted(entry.loc) for entry in sources[index]}))
                raise FeatureError(
                    f"the features {names} hash to index {index} and sum to {total:g}, "
                    f"beyond the bound +-{max_abs:g} (ROFU_MAX_ABS_FEATURE); scale them",
                    root=path,
                )
    return vector


def named_entries(context: Mapping[str, object], *, path: str = "context") -> list[Entry]:
    """The validated entries of a named object, in its order (see the module docstring).

    Raises:
        FeatureError: a malformed named object; `field` names the offending key.
    """
    entries: list[Entry] = []
    for key, value in _items(context, (), path):
        if isinstance(value, Mapping):
            for name, item in _items(value, (key,), path):
                entries += _entries(key, name, item, (key, name), path)
        else:
            entries += _entries(DEFAULT_NAMESPACE, key, value, (key,), path)
    return entries


def normalise(context: Mapping[str, object], *, path: str = "context") -> dict[str, object]:
    """A named object validated, with every number as a float (so 31 and 31.0 are one).

    Raises:
        FeatureError: a malformed named object; `field` names the offending key.
    """
    named_entries(context, path=path)  # validates
    return {
        key: {name: _floats(item) for name, item in value.items()}
        if isinstance(value, Mapping)
        else _floats(value)
        for key, value in context.items()
    }


def _floats(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int | float | list):
        return value
    if isinstance(value, list):
        return [_floats(item) for item in value]
    return float(value)


def _items(mapping: Mapping[str, object], loc: Loc, path: str) -> list[tuple[str, object]]:
    for key in mapping:
        if not isinstance(key, str) or not key:
            raise FeatureError("names must be non-empty strings", (*loc, repr(key)), root=path)
    return list(mapping.items())


def _entries(namespace: str, name: str, value: object, loc: Loc, path: str) -> list[Entry]:
    """The entries of feature `name` (at `loc`) of `namespace`."""
    if value is None or value is False:
        return []
    if value is True:
        return [Entry(loc, namespace, name, 1.0)]
    if isinstance(value, str):
        return [Entry(loc, namespace, f"{name}={value}", 1.0)]
    if isinstance(value, int | float):
        weight = _number(value, loc, path)
        return [Entry(loc, namespace, name, weight)] if weight else []
    if isinstance(value, list):
        return _list_entries(namespace, name, value, loc, path)
    if isinstance(value, Mapping):
        raise FeatureError(
            "a namespace's features cannot be objects (namespaces do not nest)", loc, root=path
        )
    raise FeatureError(f"unsupported value of type {_json_type(value)}", loc, root=path)


def _list_entries(
    namespace: str, name: str, items: list[object], loc: Loc, path: str
) -> list[Entry]:
    kind = _json_type(items[0]) if items else "string"
    if kind not in ("string", "number"):
        raise FeatureError(f"a list holds strings or numbers, not a {kind}", (*loc, 0), root=path)
    odd = next((i for i, item in enumerate(items) if _json_type(item) != kind), None)
    if odd is not None:
        raise FeatureError(
            f"a list holds only strings or only numbers: a {_json_type(items[odd])} among {kind}s",
            (*loc, odd),
            root=path,
        )
    if kind == "string":
        return [Entry((*loc, i), namespace, f"{name}={item}", 1.0) for i, item in enumerate(items)]
    numbers = [(i, _number(cast(float, item), (*loc, i), path)) for i, item in enumerate(items)]
    return [Entry((*loc, i), namespace, f"{name}[{i}]", w) for i, w in numbers if w]


def _number(value: int | float, loc: Loc, path: str) -> float:
    if isinstance(value, int) and abs(value) > FLOAT32_MAX:
        raise FeatureError("an integer too large for float32", loc, root=path)
    number = float(value)
    if not math.isfinite(number) or abs(number) > FLOAT32_MAX:
        raise FeatureError(f"{value} is not a finite float32 number", loc, root=path)
    return number


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "null" if value is None else "list" if isinstance(value, list) else "object"


def _beyond(value: float, limit: float) -> str:
    return f"{value} is beyond the bound +-{limit:g} (ROFU_MAX_ABS_FEATURE); scale the feature"


def _dotted(loc: Loc) -> str:
    return ".".join(str(part) for part in loc if part != "")
