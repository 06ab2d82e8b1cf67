"""A hyper-parameter said once: settings and variant keys derived from the config dataclasses."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from rofu.models import RofuConfig
from rofu.models.hyper import HyperField, check_hypers, hyper, hypers
from rofu.models.presets import PRODUCT
from rofu.models.rofu_config import ESTIMATORS
from rofu.replay.simulation.variants import VARIANT_KEYS, rofu_variant, variant_keys
from rofu.service.derived import SettingsPart, derived_settings
from rofu.service.settings import Settings, get_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.upper().startswith("ROFU_"):
            monkeypatch.delenv(name)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@dataclass(frozen=True)
class Knobs:
    depth: int = hyper(2, key="d", low=1)
    mode: str = hyper("a", choices=("a", "b"))

    def __post_init__(self) -> None:
        check_hypers(self)


@dataclass(frozen=True)
class MoreKnobs(Knobs):
    """Knobs with one field added, and nothing else."""

    temperature: float | None = hyper(None, low=0.0, low_open=True)


def _settings_class(config: type) -> type:
    base = derived_settings("Derived", (SettingsPart(config, config(), prefix="knob_"),))

    class Derived(base):  # type: ignore[valid-type, misc]
        model_config = SettingsConfigDict(env_prefix="ROFU_", extra="forbid", frozen=True)

    return Derived


def test_derived_settings_gain_a_field_added_to_its_dataclass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before, after = _settings_class(Knobs), _settings_class(MoreKnobs)
    assert set(before.model_fields) == {"knob_depth", "knob_mode"}
    assert set(after.model_fields) == {"knob_depth", "knob_mode", "knob_temperature"}
    monkeypatch.setenv("ROFU_KNOB_TEMPERATURE", "0.25")
    monkeypatch.setenv("ROFU_KNOB_MODE", "b")
    assert (after().knob_temperature, after().knob_mode) == (0.25, "b")
    with pytest.raises(ValidationError, match="knob_temperature"):
        after(knob_temperature=0.0)  # the declared bound, as pydantic's gt
    with pytest.raises(ValidationError, match="knob_mode"):
        after(knob_mode="c")


def test_derived_variant_keys_gain_a_field_added_to_its_dataclass() -> None:
    assert set(variant_keys({"k": Knobs})) == {"d", "mode"}
    keys = variant_keys({"k": MoreKnobs})
    assert set(keys) == {"d", "mode", "temperature"}
    part, field, parse = keys["temperature"]
    assert (part, field, parse("0.5"), parse("none")) == ("k", "temperature", 0.5, None)
    with pytest.raises(ValueError, match="declared twice"):
        variant_keys({"k": Knobs, "j": MoreKnobs})


def test_derived_dataclass_validates_from_its_declarations() -> None:
    with pytest.raises(ValueError, match="depth must be >= 1, got 0"):
        Knobs(depth=0)
    with pytest.raises(ValueError, match=r"mode must be one of \['a', 'b'\], got 'c'"):
        Knobs(mode="c")
    with pytest.raises(ValueError, match="temperature"):
        MoreKnobs(temperature=-1.0)


def _other_value(field: HyperField, current: object) -> object:
    """A valid value of a declared field that differs from `current`."""
    spec = field.spec
    if spec.choices is not None:
        return next(choice for choice in spec.choices if choice != current)
    if field.kind is int:
        return 7 if current is None else int(current) + 1  # type: ignore[call-overload]
    if field.kind is bool:
        return not current
    if current is None or current == 0.0:
        return 0.5
    return float(current) / 2.0  # type: ignore[arg-type]


def _variant_text(value: object) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("field", hypers(RofuConfig), ids=lambda field: field.name)
def test_every_rofu_config_field_is_reachable_from_settings_and_a_variant_key(
    field: HyperField, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = _other_value(field, getattr(PRODUCT.rofu, field.name))
    assert value != getattr(PRODUCT.rofu, field.name)
    monkeypatch.setenv(f"ROFU_{field.name.upper()}", _variant_text(value))
    assert getattr(Settings().rofu_config(), field.name) == value  # ROFU_<FIELD>
    key = next(
        k for k, (part, name, _) in VARIANT_KEYS.items() if (part, name) == ("rofu", field.name)
    )
    variant = rofu_variant(f"ROFU@{key}={_variant_text(value)}")
    assert getattr(variant.rofu, field.name) == value


def test_an_unknown_estimator_is_one_clear_error_naming_the_choices() -> None:
    names = [repr(name) for name in ESTIMATORS]
    with pytest.raises(ValidationError, match=", ".join(names[:-1]) + " or " + names[-1]):
        Settings(estimator="fast")
    listed = re.escape(f"estimator must be one of {list(ESTIMATORS)}")
    with pytest.raises(ValueError, match=listed + ", got 'f'"):
        rofu_variant("ROFU@est=f")
    with pytest.raises(ValueError, match=listed):
        RofuConfig(estimator="f")
