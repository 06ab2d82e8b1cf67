"""HTTP mode: the same stream played against a live service with real /select and
/reward calls. Warm-start rounds force the round-robin arm by sending it as the only
candidate. The service must be configured for the bandit: `context_dim` equal to the
bandit's and exactly `n_arms` active arms; arm i is the active arm with the i-th slot.
Where its `Sync` says so (`rofu.replay.simulation.http_plan`), a run waits for the service
to learn from the rounds it played; it records the model version and policy that decided
each round.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rofu.client import ModelResponse, RofuClient
from rofu.replay.simulation.bandits import Bandit, Stream
from rofu.replay.simulation.http_plan import ALLOW_FLAG, LEARNING_ENV, Sync, pace_line
from rofu.replay.simulation.simulate import WARM_START, RunResult

#: `SelectResponse.policy` of a decision made before any model: uniform over the candidates
COLD_START_POLICY = "cold-start"


class NoModel(RuntimeError):
    """A wait ended with no model at all: the run would be cold-start decisions."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class HttpRun:
    """A run's result, its request latencies (seconds), which model decided each round
    and the waits for the service to learn."""

    result: RunResult
    select_latency: np.ndarray  # (T,)
    reward_latency: np.ndarray  # (T,)
    versions: np.ndarray  # (T,) int64 the model version that decided each round (0: none)
    cold: np.ndarray  # (T,) bool decided by the cold-start policy (no model: uniform)
    warm_rounds: int  # the first rounds, which force the round-robin arm
    waits: tuple[float, ...] = ()  # seconds of each wait for the service to learn
    notes: tuple[str, ...] = ()  # what the run said of its pace and waits (stderr)

    def percentiles(self) -> dict[str, float]:
        """p50 / p99 of both endpoints, in milliseconds."""
        return {
            f"{name}_{label}_ms": float(1000 * np.percentile(values, q))
            for name, values in (("select", self.select_latency), ("reward", self.reward_latency))
            for label, q in (("p50", 50), ("p99", 99))
        }

    @property
    def decided_rounds(self) -> int:
        """The rounds after the warm start, where the service chose among all arms."""
        return int(self.versions.shape[0]) - self.warm_rounds

    def cold_start_share(self) -> float | None:
        """The share of the decided rounds the cold-start policy chose (None: no such round)."""
        cold = self.cold[self.warm_rounds :]
        return float(cold.mean()) if cold.size else None

    def served_versions(self) -> dict[int, int]:
        """The decided rounds each model version chose, by version (0: the cold start)."""
        versions, counts = np.unique(self.versions[self.warm_rounds :], return_counts=True)
        return {int(v): int(n) for v, n in zip(versions, counts, strict=True)}

    def learning(self) -> dict[str, object]:
        """What the run's figures say of the service's models (JSON-ready)."""
        return {
            "warm_start_rounds": self.warm_rounds,
            "decided_rounds": self.decided_rounds,
            "cold_start_share": self.cold_start_share(),
            "served_versions": {str(v): n for v, n in self.served_versions().items()},
            "waits": len(self.waits),
            "waited_s": round(sum(self.waits), 3),
        }


def service_arms(
    client: RofuClient, bandit: Bandit, model: ModelResponse | None = None
) -> list[str]:
    """The active arm ids in slot order, checked against the bandit's shape (`model`: the
    service's GET /v1/model, asked for when not given)."""
    arms = sorted((a for a in client.arms() if a.active), key=lambda a: a.slot)
    network = (model or client.model()).network
    if network["context_dim"] != bandit.context_dim or len(arms) != bandit.n_arms:
        raise ValueError(
            f"the service has context_dim {network['context_dim']} and {len(arms)} active arms;"
            f" {bandit.name} needs {bandit.context_dim} and {bandit.n_arms}"
        )
    return [a.id for a in arms]


def serve_command(bandit: Bandit) -> str:
    """The command that starts an embedded service shaped for `bandit` and quick to learn
    (`LEARNING_ENV`; a fresh database: arms that exist already stay active)."""
    arms = json.dumps([{"id": f"arm-{i}"} for i in range(bandit.n_arms)], separators=(",", ":"))
    learning = " ".join(f"{name}={value}" for name, value in LEARNING_ENV.items())
    return (
        f"ROFU_DATABASE_URL=sqlite:///var/{bandit.name.replace(':', '-')}.sqlite "
        f"ROFU_CONTEXT_DIM={bandit.context_dim} ROFU_MAX_ARMS={bandit.n_arms} "
        f"ROFU_ARMS='{arms}' {learning} rofu serve"
    )


def wait_for_model(
    client: RofuClient, rows: int, wait_s: float, poll_s: float = 0.25
) -> ModelResponse | None:
    """Ask GET /v1/model every `poll_s` until the served model learned from at least `rows`
    rows; None when `wait_s` passed first."""
    deadline = time.monotonic() + wait_s
    while True:
        model = client.model()
        if model.n_data >= rows:
            return model
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


@dataclass
class _Rounds:
    """What each round of a run chose, which model chose it, and its latencies."""

    chosen: np.ndarray  # (T,) int64
    versions: np.ndarray  # (T,) int64
    cold: np.ndarray  # (T,) bool
    select_s: np.ndarray  # (T,)
    reward_s: np.ndarray  # (T,)

    @classmethod
    def empty(cls, rounds: int) -> _Rounds:
        zeros = np.zeros(rounds, dtype=np.int64)
        return cls(zeros, zeros.copy(), np.zeros(rounds, dtype=bool), *np.zeros((2, rounds)))

    def play(
        self,
        client: RofuClient,
        t: int,
        event_id: str,
        stream: Stream,
        arms: list[str] | None,
        index: dict[str, int],
    ) -> None:
        """Round `t`: a /select among `arms` (None: all), then the chosen arm's /reward
        (`index`: arm id -> the bandit's arm)."""
        start = time.perf_counter()
        decision = client.select(
            [float(v) for v in stream.contexts[t]], event_id=event_id, arms=arms
        )
        self.select_s[t] = time.perf_counter() - start
        self.versions[t] = decision.model_version
        self.cold[t] = decision.policy == COLD_START_POLICY
        self.chosen[t] = arm = index[decision.arm]
        start = time.perf_counter()
        client.reward(event_id, float(stream.rewards[t, arm]))
        self.reward_s[t] = time.perf_counter() - start


@dataclass
class _Learning:
    """A run's waits for a model that learned from every round played so far."""

    client: RofuClient
    sync: Sync
    start: ModelResponse  # GET /v1/model before the first round
    rounds: int
    warm: int
    tell: Callable[[str], None]
    waits: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    points: set[int] = field(init=False)  # the rounds before which the run waits

    def __post_init__(self) -> None:
        self.points = set(self.sync.waits_at(self.rounds, self.warm, self.start.version))

    def before(self, t: int) -> None:
        """Wait before round `t`, where the run waits: until the served model learned from
        rounds 0 to t-1 (its |D| grew by t), or `sync.wait_s` passed.

        Raises:
            NoModel: no model at all came, and `sync.allow_cold_start` is false.
        """
        if t == self.warm and not (self.sync.mode == "every" and self.sync.every is not None):
            seconds = time.perf_counter() - self.started
            self._note(pace_line(self.start.training, t, seconds, self.rounds - t))
        if t not in self.points:
            return
        started = time.monotonic()
        rows = self.start.n_data + t
        model = wait_for_model(self.client, rows, self.sync.wait_s, self.sync.poll_s)
        self.waits.append(time.monotonic() - started)
        if model is None:
            self._gave_up(t)

    def _gave_up(self, t: int) -> None:
        served = self.client.model()
        what = (
            f"no model learned from the {t} rounds played within {self.sync.wait_s:g} s "
            f"(model {served.version} serves, learned from {served.n_data} rows)"
        )
        if served.version == 0 and not self.sync.allow_cold_start:
            raise NoModel(f"{what}: {self._why()}; pass {ALLOW_FLAG} to measure the cold start")
        self._note(f"{what}: the replay plays on without waiting")
        self.points.clear()

    def _note(self, line: str | None) -> None:
        if line is not None:
            self.tell(line)
            self.notes.append(line)

    def _why(self) -> str:
        training = self.start.training
        if training is None:
            return "the service does not say how it trains"
        if training.trainer == "external":
            return "it trains in no process of its own, and no `rofu trainer` stored a checkpoint"
        return "its own trainer stored no checkpoint (its log says why)"


def play(
    url: str,
    bandit: Bandit,
    stream: Stream,
    seed: int,
    *,
    warm_start: int = WARM_START,
    timeout_s: float = 30.0,
    sync: Sync | None = None,
    note: Callable[[str], None] = _stderr,
    api_key: str | None = None,
) -> HttpRun:
    """Play `stream` against the service at `url`, waiting where `sync` says (None: never;
    `note`: told of the run's pace and of a wait that gives up).

    Raises:
        ValueError: the service is not shaped for the bandit.
        NoModel: a wait ended with no model at all (unless `sync.allow_cold_start`).
    """
    sync = sync or Sync()
    run_id = uuid.uuid4().hex[:12]
    warm = min(warm_start * bandit.n_arms, stream.rounds)
    rounds = _Rounds.empty(stream.rounds)
    started = time.perf_counter()
    with RofuClient(url, api_key=api_key, timeout_s=timeout_s) as client:
        start = client.model()
        arm_ids = service_arms(client, bandit, start)
        index = {arm_id: i for i, arm_id in enumerate(arm_ids)}
        learning = _Learning(client, sync, start, stream.rounds, warm, note)
        for t in range(stream.rounds):
            learning.before(t)
            event_id = f"replay-{bandit.name}-{seed}-{run_id}-{t}"
            forced = [arm_ids[t % bandit.n_arms]] if t < warm else None
            rounds.play(client, t, event_id, stream, forced, index)
    config = {"url": url, "sync": sync.mode, "model_at_start": start.version}
    result = _result(bandit, seed, stream, rounds.chosen, time.perf_counter() - started, config)
    return HttpRun(
        result,
        rounds.select_s,
        rounds.reward_s,
        rounds.versions,
        rounds.cold,
        warm,
        tuple(learning.waits),
        tuple(learning.notes),
    )


def _result(
    bandit: Bandit,
    seed: int,
    stream: Stream,
    chosen: np.ndarray,
    seconds: float,
    config: dict[str, object],
) -> RunResult:
    rows = np.arange(stream.rounds)
    return RunResult(
        bandit.name,
        "service",
        seed,
        chosen,
        stream.rewards.max(axis=1) - stream.rewards[rows, chosen],
        stream.means.max(axis=1) - stream.means[rows, chosen],
        seconds,
        config=dict(config),
    )
