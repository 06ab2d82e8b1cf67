"""A user's classification file as a replay data set: reading, detection and errors."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from rofu.replay import config
from rofu.replay.simulation.conversions import zscore
from rofu.replay.simulation.datafile import (
    MAX_CLASSES,
    WHITESPACE,
    ClassificationFile,
    DataFileError,
    default_name,
    parse_delimiter,
)
from rofu.replay.simulation.datasets import load_statlog

ROWS = [(1.0, 10.0, "van"), (2.0, 30.0, "bus"), (3.0, 20.0, "van"), (4.0, 40.0, "car")]


def _write(folder: Path, text: str, name: str = "cars.csv") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def _csv(folder: Path, header: bool = True, delimiter: str = ",") -> Path:
    lines = ["width,height,kind"] if header else []
    lines += [delimiter.join(str(cell) for cell in row) for row in ROWS]
    return _write(folder, "\n".join(lines) + "\n")


def _load(path: Path, label: int = -1, delimiter: str | None = None) -> ClassificationFile:
    return ClassificationFile(path, label, default_name(path), delimiter)


def test_load_makes_a_classification_bandit_of_sorted_classes(tmp_path: Path) -> None:
    bandit = _load(_csv(tmp_path)).load()
    assert (bandit.name, bandit.context_dim, bandit.n_arms) == ("file:cars", 2, 3)
    # classes sorted: bus 0, car 1, van 2; reward 1 on the row's class, as Statlog's
    np.testing.assert_array_equal(bandit.means.argmax(axis=1), [2, 0, 2, 1])
    np.testing.assert_array_equal(bandit.means.sum(axis=1), 1.0)
    raw = np.array([row[:2] for row in ROWS])
    np.testing.assert_allclose(bandit.contexts, zscore(raw), rtol=1e-6)
    assert "after a header line" in bandit.notes
    assert "3 classes, sorted: bus, car, van" in bandit.notes
    stream = bandit.stream(50, 0)
    np.testing.assert_array_equal(stream.rewards, stream.means)


def test_label_column_counts_from_either_end(tmp_path: Path) -> None:
    path = _write(tmp_path, "".join(f"{r[2]},{r[0]},{r[1]}\n" for r in ROWS), "first.csv")
    first = _load(path, 0).load()
    again = _load(path, -3).load()
    np.testing.assert_array_equal(first.means, again.means)
    np.testing.assert_array_equal(first.contexts, _load(_csv(tmp_path), -1).load().contexts)
    middle = _load(_write(tmp_path, "0.5,1,7\n0.7,2,8\n0.9,1,9\n", "mid.csv"), 1).load()
    np.testing.assert_array_equal(middle.means.argmax(axis=1), [0, 1, 0])
    np.testing.assert_allclose(middle.contexts[:, 1], zscore(np.array([[7.0], [8.0], [9.0]]))[:, 0])


def test_numeric_labels_sort_as_numbers(tmp_path: Path) -> None:
    path = _write(tmp_path, "0.1,10\n0.2,2\n0.3,1\n0.4,2.0\n")
    bandit = _load(path).load()
    np.testing.assert_array_equal(bandit.means.argmax(axis=1), [2, 1, 0, 1])
    assert "sorted: 1, 2, 10" in bandit.notes
    assert "header" not in bandit.notes


@pytest.mark.parametrize(("delimiter", "given"), [(";", None), ("\t", None), ("|", "|")])
def test_delimiters_are_detected_or_given(
    tmp_path: Path, delimiter: str, given: str | None
) -> None:
    bandit = _load(_csv(tmp_path, header=False, delimiter=delimiter), delimiter=given).load()
    assert (bandit.context_dim, bandit.n_arms) == (2, 3)


def test_whitespace_runs_split_a_file_without_a_delimiter(tmp_path: Path) -> None:
    path = _write(tmp_path, "1  10 van\n 2\t30 bus\n\n3 20   van\n", "cars.dat")
    bandit = _load(path).load()
    assert (bandit.context_dim, bandit.n_arms, bandit.contexts.shape[0]) == (2, 2, 3)
    spaced = _load(path, delimiter=WHITESPACE).load()
    np.testing.assert_array_equal(spaced.contexts, bandit.contexts)


def test_gzip_files_are_read_decompressed(tmp_path: Path) -> None:
    plain = _csv(tmp_path)
    packed = tmp_path / "cars.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    bandit = _load(packed).load()
    assert bandit.name == "file:cars"
    np.testing.assert_array_equal(bandit.means, _load(plain).load().means)


def test_a_file_like_shuttle_trn_loads_as_the_statlog_loader_does() -> None:
    try:
        folder = config.data_dir()
    except FileNotFoundError as error:
        pytest.skip(f"benchmark data folder absent: {error}")
    path = folder / "statlog_shuttle" / "shuttle.trn"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    mine, statlog = _load(path).load(), load_statlog(folder)
    np.testing.assert_array_equal(mine.contexts, statlog.contexts)
    np.testing.assert_array_equal(mine.means, statlog.means)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b,c\n1,x,van\n2,3,bus\n", r"line 2, column 1 \(0-based\): 'x' is not a number"),
        ("1,2,van\n3,,bus\n", r"line 2, column 1 \(0-based\): '' is empty"),
        ("1,2,van\n3,nan,bus\n", r"line 2, column 1 \(0-based\): 'nan' is not finite"),
        ("1,two,van\n3,x,bus\n", "line 1, column 1"),  # not a header: line 2 is no better
        ("1,2,van\n3,4,bus,extra\n", r"line 2 has 4 columns, line 1 has 3.*--delimiter"),
        ("1\n2\n", "has one column"),
        ("1,2,van\n3,4,van\n", r"holds one class \('van'\)"),
        ("1,2,van\n3,4,\n", r"line 2: the label \(column 2\) is empty"),
        ("\n  \n", "empty"),
        ("a,b,c\n", "a header line and no rows"),
    ],
)
def test_malformed_files_are_refused_naming_where(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DataFileError, match=message):
        _load(_write(tmp_path, text)).load()


def test_a_continuous_label_column_is_refused(tmp_path: Path) -> None:
    rows = "".join(f"{i},{i * 0.5}\n" for i in range(MAX_CLASSES + 1))
    with pytest.raises(DataFileError, match=f"{MAX_CLASSES + 1} distinct values"):
        _load(_write(tmp_path, rows)).load()


@pytest.mark.parametrize("label", [3, -4, 99])
def test_label_column_out_of_range_is_refused(tmp_path: Path, label: int) -> None:
    with pytest.raises(DataFileError, match=rf"--label-column {label} is out of range.*3 columns"):
        _load(_csv(tmp_path), label).load()


def test_unreadable_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="cannot read it: No such file"):
        _load(tmp_path / "absent.csv").load()
    with pytest.raises(DataFileError, match="cannot read it"):
        _load(tmp_path).load()
    (tmp_path / "bytes.csv").write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(DataFileError, match="not a UTF-8 text file"):
        _load(tmp_path / "bytes.csv").load()
    (tmp_path / "fake.csv.gz").write_text("1,a\n2,b\n")
    with pytest.raises(DataFileError, match="fake.csv.gz"):
        _load(tmp_path / "fake.csv.gz").load()


def test_default_name_drops_suffixes_and_odd_characters() -> None:
    assert default_name(Path("/d/vehicle.csv")) == "file:vehicle"
    assert default_name(Path("vehicle.csv.gz")) == "file:vehicle"
    assert default_name(Path("my data (v2).txt")) == "file:my_data__v2_"
    assert default_name(Path("shuttle.trn")) == "file:shuttle"
    assert default_name(Path("raw")) == "file:raw"


def test_names_must_be_usable_as_folder_names(tmp_path: Path) -> None:
    for name in ("", "a/b", "../x", "with space"):
        with pytest.raises(DataFileError, match="must start with a letter or digit"):
            ClassificationFile(tmp_path, -1, name)
    assert ClassificationFile(tmp_path, -1, "file:x-1.2_y").name == "file:x-1.2_y"


def test_parse_delimiter_names_and_refusals() -> None:
    assert [parse_delimiter(t) for t in ("tab", "\\t", "TAB", ";", "space")] == [
        "\t",
        "\t",
        "\t",
        ";",
        WHITESPACE,
    ]
    for text in ("", ";;", '"', "comma"):
        with pytest.raises(ValueError, match="one character, tab or space"):
            parse_delimiter(text)
