"""What a live service's settings imply for a replay against it, read before anything is
sent (`GET /v1/model`): when its first model can come, when the replay waits for the
service to learn and for how long, and whether the run could measure more than the cold
start.

A decision is trained on once the service's reward window closed after it was made, at
the trainer's next run (after `train_every_rewards` rewards, or `train_interval_seconds`
after the last run). The replay plays far faster than that, so without waiting every
round of a short run is decided before any model exists. `--http-sync every` (the
default) plays the warm-start rounds, then waits for a model that learned from every
round played, and again every `train_every_rewards` rounds: the service learns in step
with the stream whatever the replay's speed. `first` waits once, after the warm-start
rounds, for a model that learned from them; `none` never waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rofu.client.schemas import ModelResponse, TrainingInfo

SyncMode = Literal["every", "first", "none"]
SYNC_MODES: tuple[SyncMode, ...] = ("every", "first", "none")
DEFAULT_WAIT_S = 120.0  # longer than the default reward window plus the trainer's interval
ALLOW_FLAG = "--http-allow-cold-start"
#: what the replay tells a service to run with, beside the bandit's shape: a reward comes
#: milliseconds after its decision, so a 1 s window loses none and lets the trainer, run
#: every second, learn within seconds of the rounds (the defaults wait a minute)
LEARNING_ENV = {"ROFU_REWARD_WINDOW_SECONDS": "1", "ROFU_TRAIN_INTERVAL_SECONDS": "1"}
QUICK_S = 60.0  # waits longer than this in all: say how to start a service that learns faster


class Meaningless(ValueError):
    """The service's settings would make the replay measure little but its cold start."""


@dataclass(frozen=True)
class Sync:
    """When the replay waits for the service to learn from the rounds it played.

    Attributes:
        mode: `every`, `first` or `none` (the module's docstring).
        wait_s: the longest wait for one model.
        every: rounds between waits after the first (`every` mode; None: no later waits).
        allow_cold_start: play on when no model came in time, cold-start decisions and all.
        poll_s: how often a wait asks `GET /v1/model`.
    """

    mode: SyncMode = "none"
    wait_s: float = DEFAULT_WAIT_S
    every: int | None = None
    allow_cold_start: bool = False
    poll_s: float = 0.25

    def waits_at(self, rounds: int, warm: int, version: int) -> tuple[int, ...]:
        """The rounds before which the replay waits, for a run of `rounds` whose first
        `warm` force the round-robin arm, on a service serving model `version`."""
        if self.mode == "none" or warm >= rounds:
            return ()
        if self.mode == "every" and self.every is not None:
            return tuple(range(warm, rounds, self.every))
        # `first`, or `every` on a service that does not say when it trains: model 1 only
        return () if version > 0 else (warm,)


@dataclass(frozen=True)
class Plan:
    """The waits of a run and what the service's settings imply for it, a line each."""

    sync: Sync
    lines: tuple[str, ...]


def plan(
    model: ModelResponse,
    rounds: int,
    warm: int,
    mode: SyncMode,
    wait_s: float,
    allow_cold_start: bool = False,
) -> Plan:
    """The run's plan on a service that answered `model` to `GET /v1/model`.

    Raises:
        Meaningless: unless `allow_cold_start`, where the service serves no model and the
            replay would not wait for one, or where a wait cannot outlast the reward window.
    """
    training = model.training
    every = None if training is None or mode != "every" else training.train_every_rewards
    sync = Sync(mode, wait_s, every, allow_cold_start)
    waits = sync.waits_at(rounds, warm, model.version)
    refusal = _refusal(model, mode, wait_s, waits)
    if refusal is not None and not allow_cold_start:
        raise Meaningless("; ".join(refusal))
    lines = [_service_line(model), *_state_lines(model)]
    if training is not None:
        lines += _schedule_lines(training, sync, warm, waits, model.version)
    elif mode == "every":
        lines.append("it does not say when it trains: the replay waits only for a first model")
    if refusal is not None:
        lines.append(f"{ALLOW_FLAG}: the run goes ahead, though {refusal[0]}")
    return Plan(sync, tuple(lines))


def _refusal(
    model: ModelResponse, mode: SyncMode, wait_s: float, waits: tuple[int, ...]
) -> tuple[str, str] | None:
    """Why the run would measure little but the cold start, and what to do, if it would."""
    window = None if model.training is None else model.training.reward_window_seconds
    if mode == "none" and model.version == 0:
        earliest = "" if window is None else f", {window:g} s after the first round at the earliest"
        return (
            "the service serves no model yet and --http-sync none never waits for one: its "
            f"decisions stay cold-start (uniform) until a checkpoint comes{earliest}",
            f"use --http-sync first or every, or pass {ALLOW_FLAG}",
        )
    if waits and window is not None and wait_s < window:
        return (
            f"--http-wait {wait_s:g} s is shorter than the service's {window:g} s reward "
            "window: no model can learn a round within a wait",
            "raise --http-wait, or start the service with a shorter "
            f"ROFU_REWARD_WINDOW_SECONDS, or pass {ALLOW_FLAG}",
        )
    return None


def pace_line(training: TrainingInfo | None, played: int, seconds: float, left: int) -> str | None:
    """What the pace of the first `played` rounds (`seconds`) implies for the `left` rounds
    a run plays on without waiting (None: nothing to say)."""
    if training is None or played == 0 or left == 0 or seconds <= 0:
        return None
    rate = played / seconds
    window = training.reward_window_seconds
    head = (
        f"at the pace of the first {played} rounds, {rate:.0f} a second, the other {left} "
        f"take about {left / rate:.0f} s"
    )
    if left / rate < window:
        return (
            f"{head}, less than the service's {window:g} s reward window: no model can learn "
            "one of them in time to decide another (--http-sync every waits for it to)"
        )
    return (
        f"{head}; a model learns a round {window:g} s ({window * rate:.0f} rounds) after it "
        "was played at the earliest"
    )


def _service_line(model: ModelResponse) -> str:
    head = f"the service serves model {model.version} (learned from {model.n_data} rows)"
    training = model.training
    if training is None:
        return f"{head}; it does not say when it trains (a version older than this replay)"
    where = (
        "in its own process"
        if training.trainer == "embedded"
        else "in a separate `rofu trainer` process it cannot see"
    )
    return (
        f"{head}; it trains {where}, on decisions older than its "
        f"{training.reward_window_seconds:g} s reward window, after "
        f"{training.train_every_rewards} new rewards or every "
        f"{training.train_interval_seconds:g} s"
    )


def _state_lines(model: ModelResponse) -> list[str]:
    lines = []
    if model.version > 0:
        lines.append(
            f"model {model.version} serves already: the run starts from what it learned "
            f"from {model.n_data} rows, not from the cold start"
        )
    if model.training is not None and model.training.trainer == "external":
        lines.append(
            "newer models come only from a `rofu trainer` process on the service's "
            "database; if none runs, no model will come"
        )
    return lines


def _schedule_lines(
    training: TrainingInfo, sync: Sync, warm: int, waits: tuple[int, ...], version: int
) -> list[str]:
    """When models can come, the waits for them, and whether --http-wait outlasts one."""
    low, high = _wait_range(training)
    lag = f"a model can learn a round {training.reward_window_seconds:g} s after it was played"
    if sync.mode == "none" or not waits:
        reason = "--http-sync none" if sync.mode == "none" else f"model {version} serves"
        return [f"no waits ({reason}): {lag} at the earliest, then at the trainer's next run"]
    if sync.mode == "first" or sync.every is None:
        what = f"a model that learned from them, about {low:g}-{high:g} s away"
        lines = [
            f"after the {warm} warm-start rounds the replay waits for {what}; then it plays "
            f"on without waiting ({lag})"
        ]
    else:
        lines = [
            f"after the {warm} warm-start rounds and then every {sync.every} rounds the "
            f"replay waits for a model that learned from every round played: {len(waits)} "
            f"waits of about {low:g}-{high:g} s, {len(waits) * low:g}-{len(waits) * high:g} s "
            "in all"
        ]
    if len(waits) * high > QUICK_S:
        quick = " ".join(f"{name}={value}" for name, value in LEARNING_ENV.items())
        lines.append(f"a service started with {quick} learns within a second or two")
    if sync.wait_s < high:
        lines.append(
            f"--http-wait {sync.wait_s:g} s may end a wait before its model comes (up to "
            f"{high:g} s)"
        )
    return lines


def _wait_range(training: TrainingInfo) -> tuple[float, float]:
    """How long a wait for a model lasts, about (seconds, the refit itself aside): the
    rounds' window must close, then the trainer run (every train_interval_seconds while
    no rewards come) and, from a separate trainer, a replica's poll."""
    low = training.reward_window_seconds
    high = low + training.train_interval_seconds
    if training.trainer == "external":
        high += training.checkpoint_poll_seconds
    return low, high
