"""A run's summary: what the reports read of one (bandit, policy, seed) run, about 3 KB of JSON.

The full per-round arrays (`RunResult`, .npz) go to an ignored cache; the summary is what a
study commits and what a resumed study checks. It holds the final regrets, the cumulative
pseudo-regret at `curve_rounds(T)` (at most `CURVE_POINTS` points, 4 significant digits)
and, where the run has it, regret II's (`rofu.replay.simulation.oracle`),
the chosen arm's bonus as block means (at most `BONUS_POINTS`, 3 digits), the CPU and wall
time, the configuration and the job that made it, and the per-round statistics the bonus
and ascent-step tables pool over seeds (sums, counts, a histogram), computed here from the
full arrays.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from rofu.replay.simulation.simulate import RunResult

FORMAT = 1  # bumped when a field changes meaning; a summary of another format is refused
CURVE_POINTS = 200
BONUS_POINTS = 100  # the bonus plot smooths over a fiftieth of the rounds anyway
TAIL = 0.1  # the share of the rounds after the warm start the early and late bonus cover
CUT_DIGITS = 3  # significant digits of the ascent-step histogram's bins
#: the fields a summary may lack (older ones do)
OPTIONAL = {"final_regret2", "regret2_curve", "learners"}


def curve_rounds(rounds: int, points: int = CURVE_POINTS) -> np.ndarray:
    """(n,) the rounds (1-based) a curve is kept at: n = min(points, T), evenly spaced,
    the last one T."""
    n = min(points, rounds)
    return np.ceil(np.arange(1, n + 1) * rounds / n).astype(np.int64)


def _sig(value: float, digits: int) -> float:
    """`value` to `digits` significant digits (an int where it is whole: shorter JSON)."""
    rounded = float(f"{value:.{digits}g}")
    return int(rounded) if rounded.is_integer() and abs(rounded) < 1e15 else rounded


@dataclass(frozen=True)
class BonusSummary:
    """The chosen arm's bonus: block means ending at `curve_rounds(T, BONUS_POINTS)` (None
    where a block has no finite value), the finite sum and count over the first and last
    TAIL of the rounds after the warm start, the largest value (at least 0) and whether any
    is not 0."""

    curve: list[float | None]
    early: tuple[float, int]
    late: tuple[float, int]
    largest: float
    nonzero: bool

    @classmethod
    def of(cls, bonus: np.ndarray) -> BonusSummary:
        finite = np.where(np.isfinite(bonus), bonus, np.nan)  # (T,)
        ends = curve_rounds(bonus.size, BONUS_POINTS)
        starts = np.concatenate([[0], ends[:-1]])
        curve = [_block_mean(finite[a:b]) for a, b in zip(starts, ends, strict=True)]
        chosen = np.flatnonzero(np.isfinite(finite))
        first = int(chosen[0]) if chosen.size else bonus.size
        tail = max(1, int(TAIL * (bonus.size - first)))
        return cls(
            curve,
            _sum_count(finite[first : first + tail]),
            _sum_count(finite[max(first, bonus.size - tail) :]),
            float(np.nanmax(finite, initial=0.0)),
            bool(np.nanmax(np.abs(finite), initial=0.0) > 0),
        )


def _block_mean(block: np.ndarray) -> float | None:
    present = block[np.isfinite(block)]
    return _sig(float(present.mean()), 3) if present.size else None


def _sum_count(values: np.ndarray) -> tuple[float, int]:
    present = values[np.isfinite(values)]
    return float(present.sum()), int(present.size)


@dataclass(frozen=True)
class StepSummary:
    """A ROFU run's ascent steps against its set step: the rounds that recorded one, those
    the stability cap cut, the smallest cut step / set step, and a histogram of the cuts
    (step / set step to CUT_DIGITS significant digits -> rounds)."""

    set_step: float
    rounds: int
    capped: int
    smallest: float | None
    cut: dict[str, int]

    @classmethod
    def of(cls, steps: np.ndarray, set_step: float) -> StepSummary:
        scale = steps[np.isfinite(steps)] / set_step
        cut = scale[scale < 1.0 - 1e-9]
        bins, counts = np.unique([_sig(v, CUT_DIGITS) for v in cut], return_counts=True)
        return cls(
            set_step,
            int(scale.size),
            int(cut.size),
            float(cut.min()) if cut.size else None,
            {repr(float(b)): int(c) for b, c in zip(bins, counts, strict=True)},
        )

    def cuts(self) -> np.ndarray:
        """(capped,) the histogram's cuts, one per capped round."""
        values = np.array([float(key) for key in self.cut])
        return np.repeat(values, list(self.cut.values()))


@dataclass(frozen=True)
class RunSummary:
    """One run as a report reads it (see the module docstring)."""

    bandit: str
    policy: str
    seed: int
    rounds: int
    final_regret: float  # cumulative realised regret after T rounds
    final_pseudo_regret: float  # cumulative expected regret after T rounds
    seconds: float  # wall time of the whole run
    cpu_seconds: float | None  # None: the run recorded none (before 2026-11-25)
    regret_curve: list[float]  # cumulative pseudo-regret at curve_rounds(T), 4 digits
    config: dict[str, Any] | None  # what ran (rofu.replay.simulation.policies.configuration)
    job: dict[str, Any]  # the runner's job that made it (rofu.replay.runner.Job's fields)
    bonus: BonusSummary | None = None  # None: the run recorded no bonus
    ascent: StepSummary | None = None  # None: not a ROFU run, or one that recorded no step
    # regret II (`rofu.replay.simulation.oracle`): the final value and the cumulative curve
    # at curve_rounds(T), 4 digits; None where the run has none (summaries before 2026-12)
    final_regret2: float | None = None
    regret2_curve: list[float] | None = None
    # a learner family's served rounds and resets per candidate (`RunResult.learners`)
    learners: dict[str, dict[str, int]] | None = None

    @classmethod
    def of(cls, run: RunResult, job: dict[str, Any]) -> RunSummary:
        """Summarise a full run made by `job`."""
        kept = curve_rounds(run.rounds) - 1
        cumulative = np.cumsum(run.pseudo_regret)[kept]
        two = None if run.regret2 is None else np.cumsum(run.regret2)[kept]
        params = (run.config or {}).get("params") or {}
        set_step = float(params.get("step_size") or 0.0)
        steps = run.ascent_step
        return cls(
            run.bandit,
            run.policy,
            run.seed,
            run.rounds,
            run.final_regret,
            run.final_pseudo_regret,
            run.seconds,
            run.cpu_seconds,
            [_sig(float(v), 4) for v in cumulative],
            json.loads(json.dumps(run.config)),  # as it reads back: lists, not tuples
            dict(job),
            None if run.bonus is None else BonusSummary.of(run.bonus),
            None if steps is None or not set_step else StepSummary.of(steps, set_step),
            run.final_regret2,
            None if two is None else [_sig(float(v), 4) for v in two],
            run.learners,
        )

    @property
    def preset(self) -> str:
        """The ROFU preset the run recorded ("" for other policies and older runs)."""
        preset = (self.config or {}).get("preset")
        return str(preset["name"]) if isinstance(preset, dict) else ""

    def save(self, path: Path) -> None:
        """Write atomically as JSON, one field a line (readable diffs)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"format": FORMAT, **asdict(self)}
        lines = [f"{json.dumps(k)}: {_compact(v)}" for k, v in record.items()]
        partial = path.with_name(path.name + ".partial.json")
        partial.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")
        partial.replace(path)

    @classmethod
    def load(cls, path: Path) -> RunSummary:
        """Read a file written by `save`.

        Raises:
            ValueError: the file is not a run summary of this format (it names the file).
        """
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            if record.pop("format", None) != FORMAT:
                raise ValueError(f"not format {FORMAT}")
            bonus, ascent = record.pop("bonus"), record.pop("ascent")
            names = {f.name for f in fields(cls)} - {"bonus", "ascent"}
            if not names - OPTIONAL <= set(record) <= names:
                raise ValueError(f"fields {sorted(set(record) ^ names)} differ")
            return cls(
                **record,
                bonus=None if bonus is None else _bonus(bonus),
                ascent=None if ascent is None else StepSummary(**ascent),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(
                f"{path} is not a replay run summary ({exc}); delete it to run it again"
            ) from exc


def _bonus(raw: dict[str, Any]) -> BonusSummary:
    early, late = raw.pop("early"), raw.pop("late")
    return BonusSummary(
        early=(float(early[0]), int(early[1])), late=(float(late[0]), int(late[1])), **raw
    )


def _compact(value: object) -> str:
    """JSON on one line, NaN and infinities as null."""
    return json.dumps(_finite(value), separators=(",", ":"), allow_nan=False)


def _finite(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
