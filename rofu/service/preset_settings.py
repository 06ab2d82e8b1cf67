"""How a preset becomes settings: the config dataclasses whose fields are `ROFU_*`
settings of the same name (`MODEL_PARTS`), the settings base class derived from them, and
the values a preset gives every setting not set explicitly (`preset_settings`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic_settings import BaseSettings

from rofu.models import FitConfig, RofuConfig
from rofu.models.learners import LEARNERS
from rofu.models.presets import PRODUCT, RofuPreset
from rofu.service.derived import SettingsPart, derived_settings

#: The config dataclasses whose declared fields are settings of the same name (FitConfig's
#: prefixed `fit_`; its `steps` is `Settings.fit_steps`, per run or per new row).
MODEL_PARTS = (
    SettingsPart(RofuConfig, PRODUCT.rofu),
    SettingsPart(FitConfig, PRODUCT.schedule.fit, prefix="fit_", skip=("steps",)),
)
ROFU_PART, FIT_PART = MODEL_PARTS
if TYPE_CHECKING:
    ModelSettings = BaseSettings
else:
    ModelSettings = derived_settings("ModelSettings", MODEL_PARTS)


def family_learners(preset: RofuPreset) -> tuple[str, ...]:
    """The learners a preset's trainer refits: the whole family where its schedule keeps
    one, else the MLP alone."""
    return LEARNERS if preset.schedule.family else ("mlp",)


def preset_settings(preset: RofuPreset) -> dict[str, Any]:
    """The settings a preset gives (those not set explicitly take these)."""
    return {
        "hidden": preset.hidden,
        "activation": preset.activation,
        "init_scale": preset.init_scale,
        **ROFU_PART.values(preset.rofu),
        "fit_steps_per_row": preset.fit_steps_per_row,
        **FIT_PART.values(preset.schedule.fit),
        "fit_persist": preset.schedule.persist,
        "training_window": preset.schedule.window,
        "learners": family_learners(preset),
    }
