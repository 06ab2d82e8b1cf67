"""The policies the replay harness compares, with the defaults it runs them at.

Baselines use the hyper-parameters their sources report: the Deep Bayesian Bandits
Showdown's `example_main.py` (one hidden layer of 50, init scale 0.3, RMSprop lr 0.1 with
inverse-time decay, 100 minibatches of 512 every 50 rounds) for Greedy, EpsilonGreedy,
NeuralLinear, Bootstrap, Dropout and ParamNoise; LinUCB with alpha = ridge = 1. Two
deviations, both for compute: NeuralUCB keeps its official network (one hidden layer of
100), lambda = 1e-3 and nu = 1 but trains 100 SGD minibatches of 64 every 20 rounds
instead of up to 1000 single-row steps every round; Thompson policies skip the Monte
Carlo propensity (replay needs no propensities). ROFU runs a preset of
`rofu.models.presets` (`PRODUCT`, the one the service serves, unless `--preset` names another;
tuned on seeds disjoint from the reported ones), and `Greedy-matched` is Greedy with the
preset's network and schedule, the ablation that tells exploration apart from training;
`SquareCB-matched` and `NeuralLinUCB-matched` are the learner-matched rivals on that same
network and schedule (`rofu.models.policies.matched`; MATCHED_PARAMS says where their
settings come from).
`ROFU-tuned` runs each data set's tuned preset (`TUNED_PRESETS`) beside ROFU, for the
paper protocol's second table (`rofu.replay.reports.tuned`).
On a data set whose protocol names a learner (`rofu.replay.simulation.learners`: the paper's
ablation),
ROFU and its variants, Greedy and EpsilonGreedy all run on that learner instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from rofu.models import RewardNetConfig
from rofu.models.policies import (
    Bootstrap,
    Dropout,
    DropoutParams,
    EpsilonGreedy,
    EpsilonGreedyParams,
    Greedy,
    LinUCB,
    NeuralLinear,
    NeuralLinearParams,
    NeuralLinUCB,
    NeuralLinUCBParams,
    NeuralUCB,
    NeuralUCBParams,
    ParamNoise,
    ParamNoiseParams,
    Policy,
    RofuPolicy,
    SquareCB,
    SquareCBParams,
    TrainSchedule,
    Uniform,
)
from rofu.models.presets import PRODUCT, RofuPreset
from rofu.models.reward_model import RewardModelConfig
from rofu.replay.simulation.learners import Learner
from rofu.replay.simulation.variants import (
    NEURALUCB_REPLAY_SCHEDULE,
    SHOWDOWN_SCHEDULE,
    learner_variant,
    rofu_variant,
)

Builder = Callable[[int, int, int, torch.device], Policy]


#: ROFU's preset with either estimator named explicitly (`ROFU` takes the preset's own).
ESTIMATOR_FLAVOURS = {"ROFU-exact": "exact", "ROFU-NTK": "ntk"}
#: Greedy and its learner-matched rivals on ROFU's own network and schedule.
MATCHED = ("Greedy-matched", "SquareCB-matched", "NeuralLinUCB-matched")
#: The policies a preset applies to: ROFU, its flavours and the matched ones.
PRESET_POLICIES = ("ROFU", *ESTIMATOR_FLAVOURS, *MATCHED)
#: The rivals' settings. SquareCB's gamma0 (gamma_t = gamma0 sqrt(A t)) was screened on
#: tuning seeds 1000-1001 at T = 2 000 (docs/replay.md); NeuralLinUCB keeps LinUCB's
#: alpha = ridge = 1.
MATCHED_PARAMS: dict[str, SquareCBParams | NeuralLinUCBParams] = {
    "SquareCB-matched": SquareCBParams(gamma0=10.0),
    "NeuralLinUCB-matched": NeuralLinUCBParams(alpha=1.0, ridge=1.0),
}

#: The presets the Showdown's data sets were tuned to, on tuning seeds only (the reasons
#: are in rofu.models.presets). `--preset tuned` applies them to ROFU, and `ROFU-tuned` runs
#: them beside it; nothing applies them by name alone.
TUNED_PRESETS: dict[str, str] = {
    "mushroom": "small-lr",
    "covertype": "sgd-decay",
    "adult": "sgd-decay",
    "financial": "linear",
    "jester": "linear",
}
#: ROFU on each data set's TUNED_PRESETS entry, beside ROFU on one preset: the per-data-set
#: table of the paper protocol. It runs only where that preset differs from the one ROFU
#: runs there (`rofu.replay.runner.jobs_for`); elsewhere ROFU's own runs are its cell.
TUNED_POLICY = "ROFU-tuned"


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


def _matched(
    name: str, net: RewardModelConfig, schedule: TrainSchedule, seed: int, device: torch.device
) -> Policy:
    """Greedy-matched (the ablation that separates what ROFU's exploration adds from what
    its training does) or one of its rivals, on ROFU's own network and schedule."""
    if name.startswith("Greedy-matched"):
        return Greedy(net, schedule, device=device, seed=seed)
    if name == "SquareCB-matched":
        squarecb = MATCHED_PARAMS[name]
        assert isinstance(squarecb, SquareCBParams)
        return SquareCB(net, schedule, squarecb, device=device, seed=seed)
    linucb = MATCHED_PARAMS[name]
    assert isinstance(linucb, NeuralLinUCBParams)
    return NeuralLinUCB(net, schedule, linucb, device=device, seed=seed)


def _is_matched(name: str) -> bool:
    return name in MATCHED or name.startswith("Greedy-matched@")


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


#: Every policy `rofu replay` runs when `--policies` names none.
BUILT_IN = (*POLICIES, *PRESET_POLICIES)
VARIANT_PREFIXES = ("ROFU@", "Greedy-matched@")
VW_ANCHORS = ("VW-SquareCB", "VW-EpsilonGreedy")
NAMED = (*BUILT_IN, TUNED_POLICY, *VW_ANCHORS)  # named in --policies, not run by default
KNOWN = ", ".join([*NAMED, *(f"{p}<overrides>" for p in VARIANT_PREFIXES)])


def canonical_policy_name(name: str) -> str:
    """`name` as the harness spells it, matched without regard to case (`rofu-ntk` is
    `ROFU-NTK`, `rofu@eta=1` is `ROFU@eta=1`); ValueError unless it is a built-in policy, a
    VW anchor or a valid variant."""
    head, at, overrides = name.partition("@")
    spellings = {known.lower(): known for known in NAMED}
    canonical = spellings.get(head.lower())
    if canonical is not None and not at:
        return canonical
    if canonical is not None and f"{canonical}@" in VARIANT_PREFIXES:
        variant = f"{canonical}@{overrides}"
        rofu_variant(variant)  # raises on an unknown key or a bad value
        return variant
    raise ValueError(f"unknown policy {name!r}; known: {KNOWN}")


Base = TypeVar("Base", RofuPreset, Learner)


def _flavour(name: str, base: Base) -> Base | None:
    """`base` for ROFU (and ROFU-tuned) and the matched policies, with the estimator a
    flavour names; else None."""
    if name in ("ROFU", TUNED_POLICY, *MATCHED):
        return base
    if name in ESTIMATOR_FLAVOURS:
        estimator = ESTIMATOR_FLAVOURS[name]
        return dataclasses.replace(base, rofu=dataclasses.replace(base.rofu, estimator=estimator))
    return None


def resolve_preset(name: str, preset: RofuPreset = PRODUCT) -> RofuPreset | None:
    """The preset policy `name` runs with `preset` given (None: a policy without one)."""
    if name.startswith(VARIANT_PREFIXES):
        return rofu_variant(name, preset)
    return _flavour(name, preset)


def resolve_learner(name: str, learner: Learner) -> Learner | None:
    """What policy `name` of the ROFU family runs on a bandit's learner (None: another)."""
    if name.startswith(VARIANT_PREFIXES):
        return learner_variant(name, learner)
    return _flavour(name, learner)


#: The policies that run on a bandit's learner (`rofu.replay.simulation.learners`).
LEARNER_POLICIES = (*PRESET_POLICIES, "Greedy", "EpsilonGreedy")


def _on_learner(name: str, learner: Learner, seed: int, device: torch.device) -> Policy:
    """Policy `name` on the learner's network and schedule (ROFU on its estimator too)."""
    resolved = resolve_learner(name, learner)
    if resolved is not None and _is_matched(name):
        return _matched(name, resolved.network(seed), resolved.schedule, seed, device)
    if resolved is not None:
        net = resolved.network(seed)
        return RofuPolicy(net, resolved.schedule, resolved.rofu, device=device, seed=seed)
    if name == "Greedy":
        return Greedy(learner.network(seed), learner.schedule, device=device, seed=seed)
    if name == "EpsilonGreedy":
        params = EpsilonGreedyParams(epsilon=learner.epsilon)
        net = learner.network(seed)
        return EpsilonGreedy(net, learner.schedule, params, device=device, seed=seed)
    raise ValueError(
        f"{name} does not run on a data set with a learner ({learner.name}); there run "
        f"{', '.join(LEARNER_POLICIES)} or their variants"
    )


def build_policy(
    name: str,
    context_dim: int,
    n_arms: int,
    seed: int,
    device: torch.device,
    *,
    preset: RofuPreset = PRODUCT,
    learner: Learner | None = None,
) -> Policy:
    """A fresh policy by name (the VW anchors when `vowpalwabbit` is installed).

    `ROFU`, its flavours (`ROFU-exact`, `ROFU-NTK`), their variants, `ROFU-tuned` (given
    the data set's tuned preset) and the MATCHED policies run `preset`; the other policies
    have their own fixed settings. With a `learner` (the bandit's,
    `rofu.replay.simulation.learners`), the
    policies of LEARNER_POLICIES run on it instead and the others are refused (ValueError).
    """
    if learner is not None:
        return _on_learner(name, learner, seed, device)
    resolved = resolve_preset(name, preset)
    if resolved is not None:
        if _is_matched(name):
            net = resolved.net(context_dim, n_arms, seed)
            return _matched(name, net, resolved.schedule, seed, device)
        return _rofu(resolved, context_dim, n_arms, seed, device)
    if name in POLICIES:
        return POLICIES[name](context_dim, n_arms, seed, device)
    if name in VW_ANCHORS:
        from rofu.replay.simulation import vw

        anchor = vw.VowpalWabbitSquareCB if name == "VW-SquareCB" else vw.VowpalWabbitEpsilonGreedy
        return anchor(context_dim, n_arms, seed=seed)
    raise ValueError(f"unknown policy {name!r}; known: {KNOWN}")


def configuration(policy: object, preset: RofuPreset | Learner | None = None) -> dict[str, Any]:
    """What a built policy runs with, read off the object: its class, its network's config
    and class, its dataclass settings (a neural policy's `params` and `schedule`) and plain
    numbers (and the preset's or learner's name and settings, if any)."""
    record: dict[str, Any] = {"class": type(policy).__name__}
    for key, value in sorted(vars(policy).items()):
        if key.startswith("_"):
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            record[key] = dataclasses.asdict(value)
        elif isinstance(value, bool | int | float | str):
            record[key] = value
    config = getattr(getattr(policy, "net", None), "config", None)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        record["net"] = dataclasses.asdict(config) | {"model": type(policy.net).__name__}  # type: ignore[attr-defined]
    if preset is not None:
        record["preset"] = preset.as_dict()
    return record
