"""Open Bandit Pipeline's bandit feedback, saved as a NumPy `.npz` archive.

`dict(np.load(path))` holds the keys OBP's estimators read (its `BanditFeedback`):
`n_rounds` and `n_actions` (0-d), `action` (n,) the chosen arm's slot, `reward` (n,),
`pscore` (n,) its propensity, `context` (n, D), `position` (n,) all 0 (one slot per
decision), `action_context` (n_actions, F): the arms' features when every arm has them,
else one-hot rows. Also `pi_b` (n, n_actions, 1), the logging policy's probabilities over
every slot (0 off the candidates), when every exported decision has them, and
`model_version` (n,) and `timestamp` (n,) in unix seconds.

Only rewarded decisions are rounds (OBP needs a reward per round), unless a default
reward is given for the others, as the trainer does with `ROFU_DEFAULT_REWARD`. A deferred
decision not activated in time is never a round (its choice may not have been shown), as
in training and in `rofu evaluate`.

Each array is streamed to a temporary file and copied into the archive at the end, so
memory stays constant whatever the log's length.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO

import numpy as np

from rofu.client.records import DecisionRecord


class ObpExportError(ValueError):
    """The log cannot be written as one OBP array set (e.g. its context length changes)."""


@dataclass(frozen=True)
class Catalogue:
    """What OBP needs of the arm catalogue: arm id -> slot, and the slots' features."""

    slots: dict[str, int]
    action_context: np.ndarray  # (n_actions, F)

    @classmethod
    def of(cls, arms: Sequence[tuple[str, int, Sequence[float] | None]]) -> Catalogue:
        """From (id, slot, features) of every arm ever in the catalogue."""
        n_actions = max((slot for _, slot, _ in arms), default=-1) + 1
        features = {slot: f for _, slot, f in arms}
        if arms and all(features.get(slot) for slot in range(n_actions)):
            context = np.array([features[slot] for slot in range(n_actions)], dtype=np.float64)
        else:
            context = np.eye(n_actions)
        return cls({arm: slot for arm, slot, _ in arms}, context)

    @property
    def n_actions(self) -> int:
        """Slots, retired ones included."""
        return len(self.action_context)


class _Column:
    """One array, row blocks appended to a temporary file, then copied into the archive."""

    def __init__(self, folder: Path, name: str, dtype: type[np.generic], tail: tuple[int, ...]):
        self.name, self.dtype, self.tail = name, np.dtype(dtype), tail
        self.rows = 0
        self._file: IO[bytes] = open(folder / f"{name}.bin", "w+b")  # noqa: SIM115 (see close)

    def append(self, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block, dtype=self.dtype)
        if block.shape[1:] != self.tail:
            raise ObpExportError(f"{self.name}: rows of shape {block.shape[1:]}, not {self.tail}")
        self._file.write(block.tobytes())
        self.rows += len(block)

    def copy_to(self, archive: zipfile.ZipFile) -> None:
        header = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": (self.rows, *self.tail),
        }
        with archive.open(f"{self.name}.npy", "w", force_zip64=True) as out:
            np.lib.format.write_array_header_1_0(out, header)
            self._file.seek(0)
            shutil.copyfileobj(self._file, out, 1 << 20)

    def close(self) -> None:
        self._file.close()


def write_obp(
    records: Iterable[DecisionRecord],
    path: Path,
    catalogue: Catalogue,
    *,
    default_reward: float | None = None,
    block: int = 1000,
) -> int:
    """Write the rewarded records (all of them with `default_reward`) to `path` (.npz).

    Returns:
        The number of rounds written.

    Raises:
        ObpExportError: the records' context length changes.
    """
    with tempfile.TemporaryDirectory(prefix="rofu-obp-") as folder:
        columns: dict[str, _Column] = {}
        try:
            complete = True  # every round has the logging policy's probabilities
            for rows in _blocks(_rounds(records, default_reward), block):
                if not columns:
                    dim = len(rows[0][0].context)
                    columns = _columns(Path(folder), dim, catalogue.n_actions)
                complete = _append(columns, rows, catalogue) and complete
            columns = columns or _columns(Path(folder), 0, catalogue.n_actions)
            n_rounds = columns["action"].rows
            with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
                _save(archive, "n_rounds", np.asarray(n_rounds))
                _save(archive, "n_actions", np.asarray(catalogue.n_actions))
                _save(archive, "action_context", catalogue.action_context)
                for name, column in columns.items():
                    if name != "pi_b" or complete:
                        column.copy_to(archive)
        finally:
            for column in columns.values():
                column.close()
        return n_rounds


def _save(archive: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
    with archive.open(f"{name}.npy", "w") as out:
        np.lib.format.write_array(out, array)


def _blocks(
    rounds: Iterable[tuple[DecisionRecord, float]], size: int
) -> Iterator[list[tuple[DecisionRecord, float]]]:
    iterator = iter(rounds)
    while block := list(islice(iterator, size)):
        yield block


def _rounds(
    records: Iterable[DecisionRecord], default_reward: float | None
) -> Iterable[tuple[DecisionRecord, float]]:
    for record in records:
        reward = record.reward if record.reward is not None else default_reward
        if reward is not None and record.active:
            yield record, reward


def _columns(folder: Path, context_dim: int, n_actions: int) -> dict[str, _Column]:
    specs: list[tuple[str, type[np.generic], tuple[int, ...]]] = [
        ("action", np.int64, ()),
        ("reward", np.float64, ()),
        ("pscore", np.float64, ()),
        ("context", np.float64, (context_dim,)),
        ("position", np.int64, ()),
        ("model_version", np.int64, ()),
        ("timestamp", np.float64, ()),
        ("pi_b", np.float64, (n_actions, 1)),
    ]
    return {name: _Column(folder, name, dtype, tail) for name, dtype, tail in specs}


def _append(
    columns: dict[str, _Column],
    rows: Sequence[tuple[DecisionRecord, float]],
    catalogue: Catalogue,
) -> bool:
    """Append a block of rounds; returns whether all of them have probabilities."""
    records = [record for record, _ in rows]
    if len({len(r.context) for r in records} | {columns["context"].tail[0]}) > 1:
        raise ObpExportError(
            "the context length changes within the exported window; export each "
            "context_dim's decisions apart (--since/--until)"
        )
    columns["action"].append(np.array([r.slot for r in records]))
    columns["reward"].append(np.array([reward for _, reward in rows]))
    columns["pscore"].append(np.array([r.propensity for r in records]))
    columns["context"].append(np.array([r.context for r in records]))
    columns["position"].append(np.zeros(len(records)))
    columns["model_version"].append(np.array([r.model_version for r in records]))
    columns["timestamp"].append(np.array([r.created_at.timestamp() for r in records]))
    pi_b = np.zeros((len(records), catalogue.n_actions, 1))
    complete = True
    for row, record in enumerate(records):
        if record.probabilities is None:
            complete = False
            continue
        for arm, probability in zip(record.candidates, record.probabilities, strict=True):
            pi_b[row, catalogue.slots[arm], 0] = probability
    columns["pi_b"].append(pi_b)
    return complete
