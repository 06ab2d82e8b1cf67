"""Hyper-parameters declared once, on their config dataclass's field.

A field made with `hyper(default, ...)` carries its bounds and its short name in the
replay's variant names. The dataclass validates itself from them (`check_hypers`), and
the service's settings (`rofu.service.settings`) and the replay's variant keys
(`rofu.replay.simulation.variants`) are derived from them (`hypers`): a new
hyper-parameter is one field.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from rofu.models.validation import check_choice, check_float, check_int

METADATA_KEY = "rofu.hyper"


@dataclass(frozen=True)
class Hyper:
    """The declaration of one hyper-parameter.

    Attributes:
        key: its variant key in replay policy names; None: the field's name with the
            config's prefix (`hypers`).
        low, high: the closed bounds of a number (None: unbounded).
        low_open: `low` itself is refused.
        choices: the values a string may take.
    """

    key: str | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class HyperField:
    """A declared field of a config dataclass, its value type resolved.

    Attributes:
        name: the field's name.
        kind: its value type: int, float, str or bool.
        optional: whether None is allowed.
        default: the dataclass's default.
        spec: its declaration.
    """

    name: str
    kind: type
    optional: bool
    default: Any
    spec: Hyper


def hyper(
    default: Any,
    *,
    key: str | None = None,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A dataclass field declaring a hyper-parameter (see `Hyper`)."""
    spec = Hyper(key=key, low=low, high=high, low_open=low_open, choices=choices)
    return dataclasses.field(default=default, metadata={METADATA_KEY: spec})


def hypers(cls: type) -> tuple[HyperField, ...]:
    """The declared fields of config dataclass `cls`, in field order."""
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        spec = field.metadata.get(METADATA_KEY)
        if spec is None:
            continue
        kind, optional = _value_type(hints[field.name])
        out.append(HyperField(field.name, kind, optional, field.default, spec))
    return tuple(out)


def _value_type(hint: Any) -> tuple[type, bool]:
    """(int | float | str | bool, optional) of a field's annotation."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        kinds = [arg for arg in args if arg is not type(None)]
        if len(kinds) != 1 or len(args) != 2:
            raise TypeError(f"a hyper-parameter is one type or that type | None, got {hint}")
        return _value_type(kinds[0])[0], True
    if hint not in (int, float, str, bool):
        raise TypeError(f"a hyper-parameter is an int, float, str or bool, got {hint}")
    return hint, False


def check_hypers(config: object) -> None:
    """Validate every declared field of a config dataclass instance against its bounds.

    Raises:
        TypeError, ValueError: naming the field.
    """
    for field in hypers(type(config)):
        value, spec = getattr(config, field.name), field.spec
        if value is None and field.optional:
            continue
        if field.kind is bool:
            if not isinstance(value, bool):
                raise TypeError(f"{field.name} must be a bool, got {type(value).__name__}")
        elif spec.choices is not None:
            check_choice(field.name, value, spec.choices)
        elif field.kind is int:
            low = 0 if spec.low is None else int(spec.low)
            high = None if spec.high is None else int(spec.high)
            check_int(field.name, value, low=low, high=high)
        elif field.kind is float:
            check_float(field.name, value, low=spec.low, high=spec.high, low_open=spec.low_open)
