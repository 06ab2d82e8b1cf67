"""Personalizer's feature lists as rofu's named features (`rofu.service.deciding.features`).

Personalizer sends context and action features as a list of objects ("a dictionary of
dictionaries"); rofu hashes one named object. `merge` makes one from the list:

- each object is validated as a named object (`rofu.service.deciding.features.normalise`): a key
whose
  value is an object is a namespace, any other key a feature of the default namespace;
- namespaces that appear in several objects merge key by key;
- a feature given twice (the same key of the same namespace) with the same value (the
  same JSON type and value) counts once; with another value it is an error naming both
  places, never a silent choice or sum;
- a key that is a namespace in one object and a feature in another is an error.

`Merged.origins` keeps which object each key came from, so that an error found later
(a value beyond `ROFU_MAX_ABS_FEATURE`, once hashed) can name the object it is in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rofu.service.deciding import features
from rofu.service.errors import InvalidInput

Keys = tuple[str, ...]  # a named feature's keys: (namespace, name), or (name,) by default


@dataclass(frozen=True)
class Merged:
    """Feature objects merged into one named object, and the index of the object each
    key came from (a namespace's, and each feature's)."""

    named: dict[str, object]
    origins: dict[Keys, int]

    def located(self, below: str) -> str:
        """`.<index>.<below>` for a dotted path below the merged object (`user.age` ->
        `.2.user.age`), the index of the object its longest matching key came from."""
        if not below:
            return ""
        matches = [keys for keys in self.origins if f"{below}.".startswith(".".join(keys) + ".")]
        if not matches:
            return f".{below}"
        return f".{self.origins[max(matches, key=len)]}.{below}"


def merge(objects: Sequence[Mapping[str, Any]], path: str) -> Merged:
    """Merge feature objects; `path` names the list in errors (`contextFeatures`).

    Raises:
        InvalidInput: a malformed object, or a key given twice with different values or
            as a namespace and as a feature; the field names it (`contextFeatures.1.user`).
    """
    merged = Merged({}, {})
    for index, item in enumerate(objects):
        try:
            normalised = features.normalise(item, path=f"{path}.{index}")
        except features.FeatureError as exc:
            raise InvalidInput(str(exc), field=exc.field) from exc
        for key, value in normalised.items():
            _merge_key(merged, key, value, index, path)
    return merged


def _merge_key(merged: Merged, key: str, value: object, index: int, path: str) -> None:
    """Add top-level `key` of object `index`: a namespace's features, or one feature."""
    first = merged.origins.get((key,))
    if first is not None and isinstance(merged.named[key], dict) != isinstance(value, dict):
        where = f"{path}.{index}.{key}"
        raise InvalidInput(
            f"{where}: {key!r} is a namespace in one object and a feature in another "
            f"({path}.{first}); use one or the other",
            field=where,
        )
    if not isinstance(value, dict):
        _put(merged, merged.named, (key,), value, index, path)
        return
    space = merged.named.setdefault(key, {})
    assert isinstance(space, dict)  # checked above
    merged.origins.setdefault((key,), index)
    for name, item in value.items():
        _put(merged, space, (key, name), item, index, path)


def _put(
    merged: Merged, target: dict[str, object], keys: Keys, value: object, index: int, path: str
) -> None:
    """Set feature `keys` of object `index` in `target`, unless given with the same value."""
    name = keys[-1]
    if name in target and not _same(target[name], value):
        where = f"{path}.{index}.{'.'.join(keys)}"
        raise InvalidInput(
            f"{where}: given again with another value (first in {path}.{merged.origins[keys]}); "
            "a feature has one value",
            field=where,
        )
    target.setdefault(name, value)
    merged.origins.setdefault(keys, index)


def _same(a: object, b: object) -> bool:
    """The same JSON value (as normalised: numbers are floats), `true` never equal to 1."""
    return type(a) is type(b) and a == b
