"""Settings fields derived from the model's config dataclasses (`rofu.models.hyper`).

Every declared field of a config dataclass becomes a setting of the same name (after the
part's prefix), typed and bounded as the field declares (a string's choices become a
`Literal`), defaulting to the preset's value: a new hyper-parameter is one field, and its
`ROFU_*` variable, TOML key and validation follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

from pydantic import Field, create_model
from pydantic_settings import BaseSettings

from rofu.models.hyper import HyperField, hypers


@dataclass(frozen=True)
class SettingsPart:
    """One config dataclass the settings derive fields from.

    Attributes:
        config: the dataclass, its hyper-parameters declared with `rofu.models.hyper.hyper`.
        defaults: the instance whose values the settings default to (a preset's).
        prefix: put before each field's name (`fit_` for `FitConfig`).
        skip: fields the settings spell their own way.
    """

    config: type
    defaults: object
    prefix: str = ""
    skip: tuple[str, ...] = ()

    def fields(self) -> tuple[HyperField, ...]:
        """The declared fields that become settings."""
        return tuple(f for f in hypers(self.config) if f.name not in self.skip)

    def setting(self, field: HyperField) -> str:
        """The setting a field becomes."""
        return self.prefix + field.name

    def values(self, config: object) -> dict[str, Any]:
        """setting -> value, of a `config` instance."""
        return {self.setting(f): getattr(config, f.name) for f in self.fields()}

    def read(self, settings: object) -> dict[str, Any]:
        """field -> value, read back from a settings object."""
        return {f.name: getattr(settings, self.setting(f)) for f in self.fields()}


def annotation(field: HyperField) -> Any:
    """The pydantic annotation of a declared field: its type, bounds and choices."""
    spec = field.spec
    inner: Any
    if spec.choices is not None:
        inner = Literal[spec.choices]  # Literal["a", "b"] from the tuple
    elif field.kind in (int, float):
        low = None if spec.low is None else field.kind(spec.low)
        bounds: dict[str, Any] = {"gt" if spec.low_open else "ge": low}
        if spec.high is not None:
            bounds["le"] = field.kind(spec.high)
        if field.kind is float:
            bounds["allow_inf_nan"] = False
        inner = Annotated[field.kind, Field(**{k: v for k, v in bounds.items() if v is not None})]
    else:
        inner = field.kind
    return Optional[inner] if field.optional else inner  # noqa: UP045 (built at runtime)


def derived_settings(name: str, parts: tuple[SettingsPart, ...]) -> type[BaseSettings]:
    """A `BaseSettings` class with a field per declared field of every part.

    Raises:
        ValueError: two parts derive the same setting.
    """
    fields: dict[str, Any] = {}
    for part in parts:
        for field in part.fields():
            setting = part.setting(field)
            if setting in fields:
                raise ValueError(f"setting {setting!r} is derived twice")
            fields[setting] = (annotation(field), getattr(part.defaults, field.name))
    model: type[BaseSettings] = create_model(name, __base__=BaseSettings, **fields)
    return model


def optional_settings(parts: tuple[SettingsPart, ...]) -> tuple[str, ...]:
    """The derived settings that may be None (`none` or `off` sets them so)."""
    return tuple(part.setting(f) for part in parts for f in part.fields() if f.optional)
