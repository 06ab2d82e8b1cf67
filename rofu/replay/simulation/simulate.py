"""One paired run: a policy plays a bandit's stream for one seed.

Rounds 0 .. warm_start * A - 1 pull the arms round robin (counted in the regret, and fed
to the policy); afterwards the policy chooses. Regret per round is measured against the
round's best arm, realised (max_a r_t(a) - r_t(a_t)) and expected (pseudo-regret,
max_a mu_t(a) - mu_t(a_t)). Each round also records the exploration bonus of the chosen
arm, from the scores the policy chose by (`Decision.scores.bonus`), and, for a ROFU policy,
the ascent step it scored the round with (`RofuPolicy.scoring_step`: its checkpoint's step
after the stability cap). Regret II (against an offline oracle) is added by the runner
(`rofu.replay.simulation.oracle`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rofu.models import Transitions
from rofu.models.policies import Policy, RofuPolicy
from rofu.replay.simulation.bandits import Stream

WARM_START = 3


@dataclass(frozen=True)
class RunResult:
    """What one (bandit, policy, seed) run produced, per round."""

    bandit: str
    policy: str
    seed: int
    arms: np.ndarray  # (T,) int64 chosen arms
    regret: np.ndarray  # (T,) realised per-round regret
    pseudo_regret: np.ndarray  # (T,) expected per-round regret
    seconds: float  # wall time of the whole run (select + update)
    # What ran: the policy's class, network and settings
    # (`rofu.replay.simulation.policies.configuration`);
    # None in files written before 2026-11-25, which recorded none.
    config: dict[str, Any] | None = None
    # (T,) float64 exploration bonus of the chosen arm in each round: NaN in the warm-start
    # rounds, +inf on a cold start, 0 for a policy without one (Greedy), a sampled deviation
    # for Thompson policies; None in files written before it was recorded (2026-11-25).
    bonus: np.ndarray | None = None
    # CPU seconds of the whole run (the process's, all its threads; one core when the
    # run's worker has one torch thread); None in files written before 2026-11-25.
    cpu_seconds: float | None = None
    # (T,) float64 the ascent step a ROFU policy scored each round with (its checkpoint's,
    # after the stability cap; `RofuPolicy.scoring_step`), NaN in the warm-start rounds;
    # None for other policies and in files written before it was recorded (2026-11-25).
    ascent_step: np.ndarray | None = None
    # (T,) float64 regret II per round, against the data set's offline oracle
    # (`rofu.replay.simulation.oracle`); None where none was computed (before 2026-12).
    regret2: np.ndarray | None = None
    # A ROFU run with a learner family (`family=1`): `served_rounds`, the rounds each
    # candidate was served in (it scored the choice), and `resets`, how often each one's
    # refit diverged and it started again; None for other runs and files before 2026-12-02.
    learners: dict[str, dict[str, int]] | None = None

    @property
    def rounds(self) -> int:
        """T."""
        return int(self.arms.shape[0])

    @property
    def preset(self) -> str:
        """The ROFU preset the run recorded ("" for other policies and older files)."""
        preset = (self.config or {}).get("preset")
        return str(preset["name"]) if isinstance(preset, dict) else ""

    @property
    def final_regret(self) -> float:
        """Cumulative realised regret after T rounds."""
        return float(self.regret.sum())

    @property
    def final_pseudo_regret(self) -> float:
        """Cumulative expected regret after T rounds."""
        return float(self.pseudo_regret.sum())

    @property
    def final_regret2(self) -> float | None:
        """Cumulative regret II after T rounds (None without an oracle)."""
        return None if self.regret2 is None else float(self.regret2.sum())

    def save(self, path: Path) -> None:
        """Write atomically as .npz (arrays plus a JSON header)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "bandit": self.bandit,
            "policy": self.policy,
            "seed": self.seed,
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "config": self.config,
            "learners": self.learners,
        }
        partial = path.with_name(path.name + ".partial.npz")
        arrays = {"arms": self.arms, "regret": self.regret, "pseudo_regret": self.pseudo_regret}
        if self.bonus is not None:
            arrays["bonus"] = self.bonus
        if self.ascent_step is not None:
            arrays["ascent_step"] = self.ascent_step
        if self.regret2 is not None:
            arrays["regret2"] = self.regret2
        arrays["meta"] = np.array(json.dumps(meta))
        np.savez_compressed(partial, allow_pickle=False, **arrays)
        partial.replace(path)

    @classmethod
    def load(cls, path: Path) -> RunResult:
        """Read a file written by `save`."""
        with np.load(path) as archive:
            meta = json.loads(str(archive["meta"]))
            return cls(
                meta["bandit"],
                meta["policy"],
                int(meta["seed"]),
                archive["arms"],
                archive["regret"],
                archive["pseudo_regret"],
                float(meta["seconds"]),
                meta.get("config"),
                archive["bonus"] if "bonus" in archive.files else None,
                meta.get("cpu_seconds"),
                archive["ascent_step"] if "ascent_step" in archive.files else None,
                archive["regret2"] if "regret2" in archive.files else None,
                meta.get("learners"),
            )


def simulate(
    policy: Policy,
    stream: Stream,
    *,
    bandit: str = "",
    policy_name: str = "",
    seed: int = 0,
    warm_start: int = WARM_START,
    on_round: Callable[[int], None] | None = None,
    config: dict[str, Any] | None = None,
) -> RunResult:
    """Play every round of `stream` with `policy` (which learns as it goes)."""
    n_arms = stream.rewards.shape[1]
    contexts = torch.from_numpy(stream.contexts)
    arms = np.empty(stream.rounds, dtype=np.int64)
    bonus = np.full(stream.rounds, np.nan)
    rofu = policy if isinstance(policy, RofuPolicy) else None
    steps = None if rofu is None else np.full(stream.rounds, np.nan)
    family = None if rofu is None else rofu.family
    served = None if family is None else dict.fromkeys(family.nets, 0)
    started, cpu_started = time.perf_counter(), time.process_time()
    for t in range(stream.rounds):
        x = contexts[t : t + 1]  # (1, *context_shape)
        if t < warm_start * n_arms:
            arm = t % n_arms
        else:
            decision = policy.select(x)
            arm = int(decision.arms[0])
            bonus[t] = float(decision.scores.bonus[0, arm])
            if rofu is not None and steps is not None:
                step = rofu.scoring_step
                steps[t] = np.nan if step is None else step
            if family is not None and served is not None:
                served[family.served] += 1
        arms[t] = arm
        reward = torch.tensor([stream.rewards[t, arm]], dtype=torch.float32)
        policy.update(Transitions(x, torch.tensor([arm]), reward))
        if on_round is not None:
            on_round(t)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    rows = np.arange(stream.rounds)
    regret = stream.rewards.max(axis=1) - stream.rewards[rows, arms]
    pseudo = stream.means.max(axis=1) - stream.means[rows, arms]
    name = policy_name or getattr(policy, "name", "")
    learners = None
    if family is not None and served is not None:
        learners = {"served_rounds": served, "resets": dict(family.resets)}
    return RunResult(
        bandit,
        name,
        seed,
        arms,
        regret,
        pseudo,
        seconds,
        config,
        bonus,
        cpu_seconds,
        steps,
        learners=learners,
    )
