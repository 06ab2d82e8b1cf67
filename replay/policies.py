"""The policies the replay harness compares, with the defaults it runs them at.

Baselines use the hyper-parameters their sources report: the Deep Bayesian Bandits
Showdown's `example_main.py` (one hidden layer of 50, init scale 0.3, RMSprop lr 0.1 with
inverse-time decay, 100 minibatches of 512 every 50 rounds) for Greedy, EpsilonGreedy,
NeuralLinear, Bootstrap, Dropout and ParamNoise; LinUCB with alpha = ridge = 1. Two
deviations, both for compute: NeuralUCB keeps its official network (one hidden layer of
100), lambda = 1e-3 and nu = 1 but trains 100 SGD minibatches of 64 every 20 rounds
instead of up to 1000 single-row steps every round; Thompson policies skip the Monte
Carlo propensity (replay needs no propensities). ROFU runs a preset of
`models.presets` (`PRODUCT`, the one the service serves, unless `--preset` names another;
tuned on seeds disjoint from the reported ones), and `Greedy-matched` is Greedy with the
preset's network and schedule, the ablation that tells exploration apart from training.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from models import FitConfig, RewardNet, RewardNetConfig
from models.networks import ACTIVATIONS
from models.policies import (
    SHOWDOWN_FIT,
    Bootstrap,
    Dropout,
    DropoutParams,
    EpsilonGreedy,
    Greedy,
    LinUCB,
    NeuralLinear,
    NeuralLinearParams,
    NeuralUCB,
    NeuralUCBParams,
    ParamNoise,
    ParamNoiseParams,
    Policy,
    RofuPolicy,
    TrainSchedule,
    Uniform,
)
from models.presets import PRODUCT, RofuPreset
from models.validation import check_choice

Builder = Callable[[int, int, int, torch.device], Policy]
SHOWDOWN_SCHEDULE = TrainSchedule(every=50, fit=SHOWDOWN_FIT)
NEURALUCB_REPLAY_SCHEDULE = TrainSchedule(
    every=20,
    fit=FitConfig(steps=100, batch_size=64, optimizer="sgd", lr=0.01, weight_decay=1e-3),
)


#: ROFU's preset with either estimator named explicitly (`ROFU` takes the preset's own).
ESTIMATOR_FLAVOURS = {"ROFU-exact": "exact", "ROFU-NTK": "ntk"}
#: The policies a preset applies to: ROFU, its flavours and the matched ablation.
PRESET_POLICIES = ("ROFU", *ESTIMATOR_FLAVOURS, "Greedy-matched")

#: The presets the Showdown's data sets were tuned to, on tuning seeds only (the reasons
#: are in models.presets). `--preset tuned` applies them; nothing applies them by name alone.
TUNED_PRESETS: dict[str, str] = {
    "mushroom": "small-lr",
    "covertype": "sgd-decay",
    "adult": "sgd-decay",
    "financial": "linear",
    "jester": "linear",
}

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


def showdown_net(context_dim: int, n_arms: int, seed: int) -> RewardNetConfig:
    """The Showdown's network: one hidden layer of 50, uniform init in [-0.3, 0.3]."""
    return RewardNetConfig(
        context_dim=context_dim, n_arms=n_arms, hidden=(50,), init_scale=0.3, seed=seed
    )


def _greedy(d: int, a: int, seed: int, device: torch.device) -> Policy:
    return Greedy(showdown_net(d, a, seed), SHOWDOWN_SCHEDULE, device=device, seed=seed)


def _epsilon(d: int, a: int, seed: int, device: torch.device) -> Policy:
    return EpsilonGreedy(showdown_net(d, a, seed), SHOWDOWN_SCHEDULE, device=device, seed=seed)


def _neural_linear(d: int, a: int, seed: int, device: torch.device) -> Policy:
    net = showdown_net(d, a, seed)
    params = NeuralLinearParams(propensity_samples=0)
    return NeuralLinear(net, SHOWDOWN_SCHEDULE, params, device=device, seed=seed)


def _bootstrap(d: int, a: int, seed: int, device: torch.device) -> Policy:
    return Bootstrap(showdown_net(d, a, seed), SHOWDOWN_SCHEDULE, device=device, seed=seed)


def _dropout(d: int, a: int, seed: int, device: torch.device) -> Policy:
    net, params = showdown_net(d, a, seed), DropoutParams(propensity_samples=0)
    return Dropout(net, SHOWDOWN_SCHEDULE, params, device=device, seed=seed)


def _param_noise(d: int, a: int, seed: int, device: torch.device) -> Policy:
    net, params = showdown_net(d, a, seed), ParamNoiseParams(propensity_samples=0)
    return ParamNoise(net, SHOWDOWN_SCHEDULE, params, device=device, seed=seed)


def _neural_ucb(d: int, a: int, seed: int, device: torch.device) -> Policy:
    config = RewardNetConfig(context_dim=d, n_arms=a, hidden=(100,), seed=seed)
    params = NeuralUCBParams(z="diag")
    return NeuralUCB(config, NEURALUCB_REPLAY_SCHEDULE, params, device=device, seed=seed)


def _matched_greedy(preset: RofuPreset, d: int, a: int, seed: int, device: torch.device) -> Policy:
    """Greedy with ROFU's own network and training schedule: the ablation that separates
    what ROFU's exploration adds from what its training does."""
    return Greedy(preset.net(d, a, seed), preset.schedule, device=device, seed=seed)


def _rofu(preset: RofuPreset, d: int, a: int, seed: int, device: torch.device) -> Policy:
    net = preset.net(d, a, seed)
    return RofuPolicy(net, preset.schedule, preset.rofu, device=device, seed=seed)


POLICIES: dict[str, Builder] = {
    "Uniform": lambda d, a, seed, device: Uniform(d, a, seed=seed),
    "Greedy": _greedy,
    "EpsilonGreedy": _epsilon,
    "LinUCB": lambda d, a, seed, device: LinUCB(d, a, seed=seed),
    "NeuralUCB": _neural_ucb,
    "NeuralLinear": _neural_linear,
    "Bootstrap": _bootstrap,
    "Dropout": _dropout,
    "ParamNoise": _param_noise,
}


def _widths(value: str) -> tuple[int, ...]:
    return tuple(int(w) for w in value.split("x"))


def _flag(value: str) -> bool:
    if value not in ("0", "1"):
        raise ValueError(value)
    return value == "1"


VARIANT_KEYS: dict[str, tuple[str, str, Callable[[str], object]]] = {
    "hidden": ("net", "hidden", _widths),
    "act": ("net", "activation", functools.partial(check_choice, "act", choices=ACTIVATIONS)),
    "eta": ("rofu", "eta", float),
    "base": ("rofu", "baseline", str),
    "step": ("rofu", "step_size", float),
    "steps": ("rofu", "steps", int),
    "reg": ("rofu", "regulariser", str),
    "scale": ("rofu", "bonus_scale", float),
    "l2": ("rofu", "l2", float),
    "mb": ("rofu", "minibatch_size", int),
    "est": ("rofu", "estimator", str),
    "fit_steps": ("fit", "steps", int),
    "fit_lr": ("fit", "lr", float),
    "fit_opt": ("fit", "optimizer", str),
    "fit_batch": ("fit", "batch_size", int),
    "fit_sched": ("fit", "lr_schedule", str),
    "fit_decay": ("fit", "lr_decay", float),
    "clip": ("fit", "max_grad_norm", float),
    "wd": ("fit", "weight_decay", float),
    "init": ("net", "init_scale", float),
    "every": ("schedule", "every", int),
    "persist": ("schedule", "persist", _flag),
}


#: Every policy `rofu replay` runs when `--policies` names none.
BUILT_IN = (*POLICIES, *PRESET_POLICIES)
VARIANT_PREFIXES = ("ROFU@", "Greedy-matched@")
VW_ANCHORS = ("VW-SquareCB", "VW-EpsilonGreedy")
KNOWN = ", ".join(
    [*POLICIES, *PRESET_POLICIES, *VW_ANCHORS, *(f"{p}<overrides>" for p in VARIANT_PREFIXES)]
)


def canonical_policy_name(name: str) -> str:
    """`name` as the harness spells it, matched without regard to case (`rofu-ntk` is
    `ROFU-NTK`, `rofu@eta=1` is `ROFU@eta=1`); ValueError unless it is a built-in policy, a
    VW anchor or a valid variant."""
    head, at, overrides = name.partition("@")
    spellings = {known.lower(): known for known in (*BUILT_IN, *VW_ANCHORS)}
    canonical = spellings.get(head.lower())
    if canonical is not None and not at:
        return canonical
    if canonical is not None and f"{canonical}@" in VARIANT_PREFIXES:
        variant = f"{canonical}@{overrides}"
        rofu_variant(variant)  # raises on an unknown key or a bad value
        return variant
    raise ValueError(f"unknown policy {name!r}; known: {KNOWN}")


def rofu_variant(spec: str, base: RofuPreset = PRODUCT) -> RofuPreset:
    """`base` with overrides, from a name like `ROFU@eta=0.1+reg=arm_count+hidden=100x100`
    (`Greedy-matched@...` takes the same overrides for its network and schedule).

    Keys: those of VARIANT_KEYS (hidden: widths joined by x) and learner (`showdown`: the
    Showdown baselines' network and schedule; `neuralucb`: NeuralUCB's schedule here; the
    other keys still override either). The result is named after `spec`.
    """
    _, _, overrides = spec.partition("@")
    changes: dict[str, dict[str, object]] = {"rofu": {}, "fit": {}, "schedule": {}, "net": {}}
    for item in filter(None, overrides.split("+")):
        key, _, value = item.partition("=")
        if key == "learner":
            if value not in LEARNERS:
                raise ValueError(f"learner must be one of {sorted(LEARNERS)}, got {value!r}")
            base = LEARNERS[value]
        elif key in VARIANT_KEYS:
            part, field, cast = VARIANT_KEYS[key]
            try:
                changes[part][field] = cast(value)
            except ValueError:
                raise ValueError(f"bad value {value!r} for ROFU variant key {key!r}") from None
        else:
            raise ValueError(f"unknown ROFU variant key {key!r} in {spec!r}")
    fit = dataclasses.replace(base.schedule.fit, **changes["fit"])  # type: ignore[arg-type]
    schedule = dataclasses.replace(base.schedule, fit=fit, **changes["schedule"])  # type: ignore[arg-type]
    rofu = dataclasses.replace(base.rofu, **changes["rofu"])  # type: ignore[arg-type]
    name = base.name if not overrides else f"{base.name}+{overrides}"
    return dataclasses.replace(base, name=name, rofu=rofu, schedule=schedule, **changes["net"])  # type: ignore[arg-type]


def resolve_preset(name: str, preset: RofuPreset = PRODUCT) -> RofuPreset | None:
    """The preset policy `name` runs with `preset` given (None: a policy without one)."""
    if name == "ROFU" or name == "Greedy-matched":
        return preset
    if name in ESTIMATOR_FLAVOURS:
        return dataclasses.replace(
            preset,
            rofu=dataclasses.replace(preset.rofu, estimator=ESTIMATOR_FLAVOURS[name]),
        )
    if name.startswith(VARIANT_PREFIXES):
        return rofu_variant(name, preset)
    return None


def build_policy(
    name: str,
    context_dim: int,
    n_arms: int,
    seed: int,
    device: torch.device,
    *,
    preset: RofuPreset = PRODUCT,
) -> Policy:
    """A fresh policy by name (the VW anchors when `vowpalwabbit` is installed).

    `ROFU`, its flavours (`ROFU-exact`, `ROFU-NTK`), their variants and `Greedy-matched`
    run `preset`; the other policies have their own fixed settings.
    """
    resolved = resolve_preset(name, preset)
    if resolved is not None:
        if name.startswith("Greedy-matched"):
            return _matched_greedy(resolved, context_dim, n_arms, seed, device)
        return _rofu(resolved, context_dim, n_arms, seed, device)
    if name in POLICIES:
        return POLICIES[name](context_dim, n_arms, seed, device)
    if name in VW_ANCHORS:
        from replay import vw  # the optional `vw` extra

        anchor = vw.VowpalWabbitSquareCB if name == "VW-SquareCB" else vw.VowpalWabbitEpsilonGreedy
        return anchor(context_dim, n_arms, seed=seed)
    raise ValueError(f"unknown policy {name!r}; known: {KNOWN}")


def configuration(policy: object, preset: RofuPreset | None = None) -> dict[str, Any]:
    """What a built policy runs with, read off the object: its class, its network, its
    dataclass settings (a neural policy's `params` and `schedule`) and plain numbers (and
    the preset's name and settings, if any)."""
    record: dict[str, Any] = {"class": type(policy).__name__}
    for key, value in sorted(vars(policy).items()):
        if key.startswith("_"):
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            record[key] = dataclasses.asdict(value)
        elif isinstance(value, bool | int | float | str):
            record[key] = value
    net = getattr(policy, "net", None)
    if isinstance(net, RewardNet):
        record["net"] = dataclasses.asdict(net.config)
    if preset is not None:
        record["preset"] = preset.as_dict()
    return record
