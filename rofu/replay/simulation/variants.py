"""Variant names: a preset or a bandit's learner with overrides, named in `--policies`.

`ROFU@eta=0.1+reg=arm_count+hidden=100x100` is ROFU on its preset with those settings
changed (`Greedy-matched@...` takes the same keys); `learner=showdown` or `learner=neuralucb`
puts ROFU's estimator on a baseline's network and training, so that ROFU against that
baseline is exploration alone. The keys are those of `VARIANT_KEYS`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from rofu.models import FitConfig, RewardNetConfig, RofuConfig
from rofu.models.hyper import HyperField, hypers
from rofu.models.networks import ACTIVATIONS
from rofu.models.policies import SHOWDOWN_FIT, TrainSchedule
from rofu.models.presets import PRODUCT, RofuPreset
from rofu.models.validation import check_choice
from rofu.replay.simulation.learners import Learner

SHOWDOWN_SCHEDULE = TrainSchedule(every=50, fit=SHOWDOWN_FIT)
NEURALUCB_REPLAY_SCHEDULE = TrainSchedule(
    every=20,
    fit=FitConfig(steps=100, batch_size=64, optimizer="sgd", lr=0.01, weight_decay=1e-3),
)

LEARNERS = {
    "rofu": PRODUCT,
    # ROFU's estimator on the Showdown baselines' learner: ROFU against Greedy is then
    # exploration alone.
    "showdown": dataclasses.replace(
        PRODUCT, name="showdown-learner", hidden=(50,), init_scale=0.3, schedule=SHOWDOWN_SCHEDULE
    ),
    # NeuralUCB's learner here (same network, SGD with weight decay every 20 rounds): ROFU
    # against NeuralUCB is then exploration alone.
    "neuralucb": dataclasses.replace(
        PRODUCT, name="neuralucb-learner", schedule=NEURALUCB_REPLAY_SCHEDULE
    ),
}


def _widths(value: str) -> tuple[int, ...]:
    return tuple(int(w) for w in value.split("x"))


def _flag(value: str) -> bool:
    if value not in ("0", "1"):
        raise ValueError(value)
    return value == "1"


def _parser(field: HyperField) -> Callable[[str], object]:
    """The variant value's parser of a declared field: `none` for None where optional,
    0/1 for a flag."""
    cast: Callable[[str], object] = _flag if field.kind is bool else field.kind
    if not field.optional:
        return cast
    return lambda value: None if value == "none" else cast(value)


#: The parts a variant overrides, each a config dataclass (`rofu.models.hyper`); a key is
#: the field's declared `key`, else its name.
PARTS: dict[str, type] = {"rofu": RofuConfig, "fit": FitConfig, "schedule": TrainSchedule}


def variant_keys(parts: dict[str, type]) -> dict[str, tuple[str, str, Callable[[str], object]]]:
    """key -> (part, field, parser) of every declared field of the parts' dataclasses.

    Raises:
        ValueError: two fields declare the same key.
    """
    keys: dict[str, tuple[str, str, Callable[[str], object]]] = {}
    for part, cls in parts.items():
        for field in hypers(cls):
            key = field.spec.key or field.name
            if key in keys:
                raise ValueError(f"variant key {key!r} is declared twice ({part}.{field.name})")
            keys[key] = (part, field.name, _parser(field))
    return keys


#: The network's keys (the preset's, not a config dataclass), then the declared ones.
VARIANT_KEYS: dict[str, tuple[str, str, Callable[[str], object]]] = {
    "hidden": ("net", "hidden", _widths),
    "act": ("net", "activation", functools.partial(check_choice, "act", choices=ACTIVATIONS)),
    "init": ("net", "init_scale", float),
    **variant_keys(PARTS),
}


Changes = dict[str, dict[str, object]]


def _variant_changes(spec: str) -> tuple[str | None, Changes]:
    """The `learner=` value (None if absent) and the overrides by part, from a variant name."""
    _, _, overrides = spec.partition("@")
    learner: str | None = None
    changes: Changes = {"rofu": {}, "fit": {}, "schedule": {}, "net": {}}
    for item in filter(None, overrides.split("+")):
        key, _, value = item.partition("=")
        if key == "learner":
            if value not in LEARNERS:
                raise ValueError(f"learner must be one of {sorted(LEARNERS)}, got {value!r}")
            learner = value
        elif key in VARIANT_KEYS:
            part, field, cast = VARIANT_KEYS[key]
            try:
                changes[part][field] = cast(value)
            except ValueError:
                raise ValueError(f"bad value {value!r} for ROFU variant key {key!r}") from None
        else:
            raise ValueError(f"unknown ROFU variant key {key!r} in {spec!r}")
    return learner, changes


def _trained(base: RofuPreset | Learner, changes: Changes) -> tuple[RofuConfig, TrainSchedule]:
    """The base's estimator and schedule with the overrides."""
    fit = dataclasses.replace(base.schedule.fit, **changes["fit"])  # type: ignore[arg-type]
    schedule = dataclasses.replace(base.schedule, fit=fit, **changes["schedule"])  # type: ignore[arg-type]
    return dataclasses.replace(base.rofu, **changes["rofu"]), schedule  # type: ignore[arg-type]


def _variant_name(base: str, spec: str) -> str:
    overrides = spec.partition("@")[2]
    return base if not overrides else f"{base}+{overrides}"


def rofu_variant(spec: str, base: RofuPreset = PRODUCT) -> RofuPreset:
    """`base` with overrides, from a name like `ROFU@eta=0.1+reg=arm_count+hidden=100x100`
    (`Greedy-matched@...` takes the same overrides for its network and schedule).

    Keys: those of VARIANT_KEYS (hidden: widths joined by x) and learner (`showdown`: the
    Showdown baselines' network and schedule; `neuralucb`: NeuralUCB's schedule here; the
    other keys still override either). The result is named after `spec`.
    """
    learner, changes = _variant_changes(spec)
    base = base if learner is None else LEARNERS[learner]
    rofu, schedule = _trained(base, changes)
    name = _variant_name(base.name, spec)
    return dataclasses.replace(base, name=name, rofu=rofu, schedule=schedule, **changes["net"])  # type: ignore[arg-type]


def learner_variant(spec: str, base: Learner) -> Learner:
    """A bandit's learner with a variant's overrides (`ROFU@steps=10`): the network keys
    apply to an MLP learner only, and `learner=` to none (the bandit fixes the learner)."""
    learner, changes = _variant_changes(spec)
    if learner is not None:
        raise ValueError(f"learner={learner}: {base.name} is fixed for this data set")
    net = base.net
    if changes["net"]:
        if not isinstance(net, RewardNetConfig):
            keys = ", ".join(changes["net"])
            raise ValueError(f"{keys}: no such setting of {base.name}'s {type(net).__name__}")
        net = dataclasses.replace(net, **changes["net"])  # type: ignore[arg-type]
    rofu, schedule = _trained(base, changes)
    name = _variant_name(base.name, spec)
    return dataclasses.replace(base, name=name, net=net, rofu=rofu, schedule=schedule)
