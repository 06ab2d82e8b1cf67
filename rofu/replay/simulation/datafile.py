"""A classification file of your own as a replay data set (`rofu replay --dataset-file`).

One row per line: numeric features and one label column (`label_column`, 0-based; -1 the
last). The label's distinct values, sorted (numerically when every label is a number), are
the arms, and a row pays 1 on its class's arm and 0 elsewhere: the classification bandit
of Statlog and Covertype. The features are z-scored on the whole file, as Statlog's are.
Cells are split on `delimiter`; without one, on the first of `, ; tab |` that the first
line holds, else on runs of whitespace. The first line is a header, and skipped, when
none of its feature cells is a number, or some is not and all of the second line's are.
Blank lines are skipped; a `.gz` file is read decompressed. Every error names the file,
and the line and column where it can.
"""

from __future__ import annotations

import csv
import gzip
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rofu.replay.simulation.bandits import PoolBandit
from rofu.replay.simulation.conversions import class_means, zscore

DELIMITERS = (",", ";", "\t", "|")  # looked for, in this order, in the first line
WHITESPACE = " "  # as a delimiter: any run of spaces and tabs
DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "space": WHITESPACE, "whitespace": WHITESPACE}
MAX_CLASSES = 100  # more distinct labels than this is a feature column picked by mistake
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")  # it names a folder of run files


class DataFileError(ValueError):
    """The file cannot be read as a classification data set; the message says where."""


def parse_delimiter(text: str) -> str:
    """One character, or `tab` / `\\t`, `space` / `whitespace` (any run of blanks).

    Raises:
        ValueError: anything else.
    """
    delimiter = DELIMITER_NAMES.get(text.lower(), text)
    if len(delimiter) != 1 or delimiter in '"\r\n':
        raise ValueError(f"the delimiter must be one character, tab or space, got {text!r}")
    return delimiter


def default_name(path: Path) -> str:
    """`file:<the file's name without its suffixes>`, e.g. `file:vehicle` for vehicle.csv.gz."""
    stem = path.name.removesuffix(".gz")
    stem = stem.rsplit(".", 1)[0] if "." in stem.lstrip(".") else stem
    return "file:" + (re.sub(r"[^A-Za-z0-9._-]", "_", stem).lstrip("._-") or "data")


@dataclass(frozen=True)
class ClassificationFile:
    """Where a classification file is and how to read it (hashable: workers load it by it).

    Attributes:
        path: the file.
        label_column: 0-based index of the label column; negative counts from the end.
        name: the data set's name in run files and reports.
        delimiter: one character (`WHITESPACE`: runs of blanks); None to detect it.
    """

    path: Path
    label_column: int = -1
    name: str = ""
    delimiter: str | None = None

    def __post_init__(self) -> None:
        if not NAME_PATTERN.fullmatch(self.name):
            raise DataFileError(
                f"data set name {self.name!r} must start with a letter or digit and hold only "
                "letters, digits and . _ : -"
            )

    def load(self) -> PoolBandit:
        """The bandit: z-scored features, one arm per class, reward 1 for the row's class.

        Raises:
            DataFileError: the file is unreadable, ragged, has a non-numeric feature, a
                missing label, one class only or more than MAX_CLASSES, or no such column.
        """
        lines, delimiter = _lines(self.path, self.delimiter)
        rows = _split(self.path, lines, delimiter)
        label = _column_index(self.path, self.label_column, len(rows[0][1]))
        header = _is_header(rows, label)
        rows = rows[1:] if header else rows
        if not rows:
            raise DataFileError(f"{self.path}: the file has a header line and no rows")
        features = _features(self.path, rows, label)
        codes, classes = _classes(self.path, [(n, cells[label]) for n, cells in rows], label)
        shown = ", ".join(classes[:8]) + (", ..." if len(classes) > 8 else "")
        notes = (
            f"{self.path.name}: {len(rows)} rows{' after a header line' if header else ''}; "
            f"{features.shape[1]} numeric features z-scored on the file; label column {label} "
            f"({len(classes)} classes, sorted: {shown}) -> arms 0..{len(classes) - 1}, "
            "reward 1 if true class"
        )
        return PoolBandit(
            self.name, zscore(features), class_means(codes, len(classes)), notes=notes
        )


def _lines(path: Path, delimiter: str | None) -> tuple[list[tuple[int, str]], str]:
    """The non-blank lines with their 1-based numbers, and the delimiter (detected if None)."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8-sig") as stream:
                text = stream.read()
        else:
            text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:  # gzip.BadGzipFile is one
        raise DataFileError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, EOFError, zlib.error) as exc:
        raise DataFileError(f"{path}: not a UTF-8 text file, or a damaged .gz ({exc})") from exc
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise DataFileError(f"{path}: the file is empty")
    if delimiter is None:
        delimiter = next((d for d in DELIMITERS if d in lines[0][1]), WHITESPACE)
    return lines, delimiter


def _split(path: Path, lines: list[tuple[int, str]], delimiter: str) -> list[tuple[int, list[str]]]:
    """The lines as (line number, cells), every one as wide as the first."""
    if delimiter == WHITESPACE:
        rows = [(n, line.split()) for n, line in lines]
    else:
        rows = [(n, _cells(line, delimiter)) for n, line in lines]
    first, width = rows[0][0], len(rows[0][1])
    if width < 2:
        shown = "whitespace" if delimiter == WHITESPACE else repr(delimiter)
        raise DataFileError(
            f"{path}: line {first} split on {shown} has one column: a classification file "
            "needs a label and at least one feature (is --delimiter right?)"
        )
    for number, cells in rows:
        if len(cells) != width:
            raise DataFileError(
                f"{path}: line {number} has {_columns(len(cells))}, line {first} has {width} "
                "(is --delimiter right?)"
            )
    return rows


def _columns(count: int) -> str:
    return f"{count} column{'' if count == 1 else 's'}"


def _cells(line: str, delimiter: str) -> list[str]:
    return [cell.strip() for cell in next(csv.reader([line], delimiter=delimiter))]


def _is_header(rows: list[tuple[int, list[str]]], label: int) -> bool:
    """Whether the first line names the columns: none of its feature cells is a number, or
    some is not and the second line's all are (else its bad cell is named, not skipped)."""

    def numbers(cells: list[str]) -> list[bool]:
        return [_is_number(cell) for i, cell in enumerate(cells) if i != label]

    first = numbers(rows[0][1])
    return not any(first) or (not all(first) and len(rows) > 1 and all(numbers(rows[1][1])))


def _column_index(path: Path, column: int, width: int) -> int:
    if not -width <= column < width:
        raise DataFileError(
            f"{path}: --label-column {column} is out of range: the file has {width} columns "
            f"(0..{width - 1}, or -{width}..-1 from the end)"
        )
    return column % width


def _features(path: Path, rows: list[tuple[int, list[str]]], label: int) -> np.ndarray:
    """(N, D) float64 of every column but the label; else the first bad cell is named."""
    cells = [row[:label] + row[label + 1 :] for _, row in rows]
    try:
        features = np.array(cells, dtype=np.float64)
        if np.isfinite(features).all():
            return features
    except ValueError:
        pass
    for number, row in rows:
        for column, cell in enumerate(row):
            problem = None if column == label else _problem(cell)
            if problem:
                raise DataFileError(
                    f"{path}: line {number}, column {column} (0-based): {cell!r} {problem}; "
                    f"every column but the label (column {label}) must hold finite numbers"
                )
    raise AssertionError("unreachable: no bad feature cell found")  # pragma: no cover


def _problem(cell: str) -> str | None:
    if not cell:
        return "is empty"
    try:
        value = float(cell)
    except ValueError:
        return "is not a number"
    return None if np.isfinite(value) else "is not finite"


def _classes(
    path: Path, labels: list[tuple[int, str]], column: int
) -> tuple[np.ndarray, list[str]]:
    """((N,) arm of each row, the classes in arm order): numeric order if all are numbers."""
    for number, label in labels:
        if not label:
            raise DataFileError(f"{path}: line {number}: the label (column {column}) is empty")
    texts = [label for _, label in labels]
    if all(_problem(text) is None for text in texts):
        values, codes = np.unique(np.array(texts, dtype=np.float64), return_inverse=True)
        classes = [f"{value:g}" for value in values]
    else:
        names, codes = np.unique(np.array(texts), return_inverse=True)
        classes = [str(name) for name in names]
    if len(classes) < 2:
        raise DataFileError(
            f"{path}: the label column {column} holds one class ({classes[0]!r}); a bandit "
            "needs two arms at least"
        )
    if len(classes) > MAX_CLASSES:
        raise DataFileError(
            f"{path}: the label column {column} holds {len(classes)} distinct values (at most "
            f"{MAX_CLASSES} classes): is it the label? (--label-column)"
        )
    return codes.reshape(-1), classes


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
