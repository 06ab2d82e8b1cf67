"""The Deep Bayesian Bandits Showdown data sets (Riquelme et al. 2018) as `Bandit`s.

One loader per data set reads the files under the benchmark data folder (see
`shared/data/SOURCES.md`) and returns a bandit; the registry `DATASETS` names each with its
loader and the files it reads, so a run can check them before it starts; a user's own
classification file loads through `rofu.replay.simulation.datafile`. `docs/datasets.md` records
for each
the files, pool size, context dim, arms, reward rule and every departure from the Showdown.
Shared departures: every pool bandit draws its rows uniformly *with* replacement (the
Showdown shuffles and takes the first T rows, except for Mushroom) and z-scores with the
statistics of the whole pool (the Showdown: of the T rows it kept); Adult's and Census's
one-hot columns stay 0/1 (the Showdown z-scores them too; `zscore_all=True` does that).
Covertype and Census are only partly available; Census runs on its 199 rows, a pool that
any policy that memorises rows learns outright (its reports say so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rofu.replay import config
from rofu.replay.simulation.bandits import (
    Bandit,
    MLPBandit,
    PoolBandit,
    ResNetBandit,
    RotatedBandit,
    WheelBandit,
)
from rofu.replay.simulation.conversions import (
    FinancialBandit,
    class_means,
    label_codes,
    mushroom_means,
    mushroom_sampler,
    one_hot,
    zscore,
)
from rofu.replay.simulation.datafile import ClassificationFile

ADULT_COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country", "income",
)  # fmt: skip
ADULT_NUMERIC = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
JESTER_CONTEXT_JOKES, JESTER_ARMS = 32, 8
FINANCIAL_ARMS = 8
# the files each loader reads, relative to the data folder (the registry lists them too)
MUSHROOM_FILE = "mushroom/agaricus-lepiota.data"
STATLOG_FILE = "statlog_shuttle/shuttle.trn"
COVERTYPE_FILE = "covertype/covtype_ramp92962.data.gz"
ADULT_FILES = ("adult/adult.data", "adult/adult.test")
CENSUS_FILE = "census1990/USCensus1990.first199rows.csv"
JESTER_FILE = "jester/jester_data_40jokes_19181users.npy"
FINANCIAL_FILE = "financial/raw_stock_contexts"


def _expect_columns(array: np.ndarray, columns: int, path: Path) -> np.ndarray:
    if array.ndim != 2 or array.shape[1] != columns:
        raise ValueError(f"{path}: expected {columns} columns, got shape {array.shape}")
    return array


def load_mushroom(folder: Path) -> PoolBandit:
    """UCI Mushroom: one-hot of the 22 attributes; arm 0 don't eat, arm 1 eat."""
    path = folder / MUSHROOM_FILE
    frame = pd.read_csv(path, header=None, dtype=str)
    _expect_columns(frame.to_numpy(), 23, path)
    # '?' (stalk-root unknown) stays a category of its own, as in the Showdown
    contexts = one_hot(frame.iloc[:, 1:])
    poisonous = (frame[0] == "p").to_numpy()
    notes = (
        f"UCI agaricus-lepiota.data, {len(frame)} rows; one-hot of the 22 attributes in file "
        f"order ({contexts.shape[1]} dims, '?' a category); arm 0 don't eat (0), arm 1 eat "
        "(+5 edible; poisonous +5 or -35 on a fair per-round coin, mean -15)"
    )
    return PoolBandit(
        "mushroom", contexts, mushroom_means(poisonous), mushroom_sampler(poisonous), notes
    )


def load_statlog(folder: Path) -> PoolBandit:
    """UCI Statlog (Shuttle), shuttle.trn only as the Showdown: 9 z-scored features, 7 classes."""
    path = folder / STATLOG_FILE
    data = _expect_columns(np.loadtxt(path), 10, path)
    notes = (
        f"UCI shuttle.trn only (as the Showdown; shuttle.tst unused), {len(data)} rows; "
        "9 features z-scored on the pool; classes 1..7 -> arms 0..6, reward 1 if true class"
    )
    labels = data[:, -1].astype(np.int64) - 1
    return PoolBandit("statlog", zscore(data[:, :-1]), class_means(labels, 7), notes=notes)


def load_covertype(folder: Path) -> PoolBandit:
    """UCI Covertype, PARTIAL: the 92962-row random subset; all 54 columns z-scored."""
    path = folder / COVERTYPE_FILE
    data = _expect_columns(pd.read_csv(path, header=None).to_numpy(), 55, path)
    notes = (
        f"PARTIAL: {len(data)}-row random subset (16%) of UCI covtype, no header row lost; "
        "all 54 columns z-scored on the pool (binary ones too, as the Showdown); "
        "classes 1..7 -> arms 0..6, reward 1 if true class"
    )
    labels = data[:, -1].astype(np.int64) - 1
    return PoolBandit("covertype", zscore(data[:, :-1]), class_means(labels, 7), notes=notes)


def _read_adult(folder: Path) -> pd.DataFrame:
    """adult.data + adult.test (its first line skipped, the '.' of its labels stripped)."""
    read = {
        "header": None,
        "names": list(ADULT_COLUMNS),
        "skipinitialspace": True,
        "na_values": "?",
    }
    train = pd.read_csv(folder / ADULT_FILES[0], **read)
    test = pd.read_csv(folder / ADULT_FILES[1], skiprows=1, **read)
    test["income"] = test["income"].str.rstrip(".")
    return pd.concat([train, test], ignore_index=True).dropna().reset_index(drop=True)


def load_adult(folder: Path, *, zscore_all: bool = False) -> PoolBandit:
    """UCI Adult: label occupation (14 arms); z-scored numeric + one-hot categorical features.

    Args:
        folder: the benchmark data folder.
        zscore_all: also z-score the one-hot columns, as the Showdown does.
    """
    frame = _read_adult(folder)
    codes, classes = label_codes(frame["occupation"])
    categorical = [c for c in ADULT_COLUMNS if c not in (*ADULT_NUMERIC, "occupation")]
    numeric = zscore(frame[list(ADULT_NUMERIC)].to_numpy())
    dummies = one_hot(frame[categorical])
    contexts = np.hstack([numeric, zscore(dummies) if zscore_all else dummies])
    notes = (
        f"UCI adult.data + adult.test minus rows with '?': {len(frame)} rows; label occupation "
        f"({len(classes)}, sorted) -> arms; 6 numeric z-scored + one-hot of 8 categorical incl. "
        f"income = {contexts.shape[1]} dims (Showdown 94: income kept the test file's '.')"
        + ("; one-hot columns z-scored too" if zscore_all else "")
    )
    return PoolBandit("adult", contexts, class_means(codes, len(classes)), notes=notes)


def load_census(folder: Path, *, zscore_all: bool = False) -> PoolBandit:
    """US Census 1990, PARTIAL (first 199 rows): one-hot features, label dOccup.

    Args:
        folder: the benchmark data folder.
        zscore_all: also z-score the one-hot columns, as the Showdown does.
    """
    path = folder / CENSUS_FILE
    frame = pd.read_csv(path)
    codes, classes = label_codes(frame["dOccup"])
    contexts = one_hot(frame.drop(columns=["caseid", "dOccup"]))
    if zscore_all:
        contexts = zscore(contexts)
    notes = (
        f"PARTIAL: first {len(frame)} rows of USCensus1990, a {len(frame)}-row pool whose rows "
        "repeat within a run, not the Showdown's 2.5M-row Census; one-hot of the "
        f"{frame.shape[1] - 2} columns but caseid and dOccup ({contexts.shape[1]} dims; "
        f"Showdown ~389); dOccup -> arms by sorted value, only the {len(classes)} that occur "
        "(full data: 9)"
    )
    return PoolBandit("census", contexts, class_means(codes, len(classes)), notes=notes)


def load_jester(folder: Path) -> PoolBandit:
    """Jester 40 jokes x 19181 users: 32 ratings as context, the other 8 jokes as arms."""
    path = folder / JESTER_FILE
    ratings = np.load(path, allow_pickle=False)
    _expect_columns(ratings, JESTER_CONTEXT_JOKES + JESTER_ARMS, path)
    notes = (
        f"Jester {ratings.shape[1]} jokes x {len(ratings)} users, rebuilt (column order not "
        "confirmed as the Showdown's); raw ratings of the first 32 jokes as context, arms = "
        "last 8 jokes, reward = the user's rating; no column shuffle"
    )
    return PoolBandit(
        "jester", ratings[:, :JESTER_CONTEXT_JOKES], ratings[:, JESTER_CONTEXT_JOKES:], notes=notes
    )


def load_financial(folder: Path) -> FinancialBandit:
    """Financial: raw stock contexts, 8 linear arms drawn per seed."""
    path = folder / FINANCIAL_FILE
    contexts = _expect_columns(np.loadtxt(path, skiprows=1), 21, path)
    notes = (
        f"raw_stock_contexts {len(contexts)} days x {contexts.shape[1]} stocks, raw as the "
        f"Showdown; {FINANCIAL_ARMS} arms, mean x . beta_a, beta_a uniform in [-1, 1]^D "
        "scaled to unit norm per seed, noise std 0.01 (a + 1)"
    )
    return FinancialBandit(contexts, FINANCIAL_ARMS, 0.01, notes)


def load_wheel(folder: Path) -> Bandit:
    """The wheel bandit with the Showdown's delta 0.95 (the folder is ignored)."""
    return WheelBandit()


def load_mlp(folder: Path) -> Bandit:
    """The paper's MLP bandit (the folder is ignored)."""
    return MLPBandit()


def load_resnet(folder: Path) -> Bandit:
    """The paper's ResNet bandit with a random ResNet-20 simulator (the folder is ignored)."""
    return ResNetBandit()


def load_statlog_rotated(folder: Path) -> Bandit:
    """Statlog whose arms rotate by one half-way through the run (`RotatedBandit`)."""
    return RotatedBandit(load_statlog(folder))


@dataclass(frozen=True)
class Dataset:
    """A registered data set: its loader (which builds its bandit) and the files it reads.

    Attributes:
        load: the data folder -> the bandit.
        files: paths relative to the data folder; none for a synthetic bandit.
    """

    load: Callable[[Path], Bandit]
    files: tuple[str, ...] = ()

    @property
    def synthetic(self) -> bool:
        """Whether it reads no file (and needs no data folder)."""
        return not self.files


DATASETS: dict[str, Dataset] = {
    "mushroom": Dataset(load_mushroom, (MUSHROOM_FILE,)),
    "statlog": Dataset(load_statlog, (STATLOG_FILE,)),
    "statlog-rotated": Dataset(load_statlog_rotated, (STATLOG_FILE,)),
    "covertype": Dataset(load_covertype, (COVERTYPE_FILE,)),
    "adult": Dataset(load_adult, ADULT_FILES),
    "census": Dataset(load_census, (CENSUS_FILE,)),
    "jester": Dataset(load_jester, (JESTER_FILE,)),
    "financial": Dataset(load_financial, (FINANCIAL_FILE,)),
    "wheel": Dataset(load_wheel),
    "mlp": Dataset(load_mlp),
    "resnet": Dataset(load_resnet),
}


def _registered(name: str) -> Dataset:
    key = name.lower()
    if key not in DATASETS:
        raise ValueError(
            f"unknown data set {name!r}; known: {', '.join(DATASETS)} (a classification file "
            "of your own: --dataset-file PATH --label-column N)"
        )
    return DATASETS[key]


def check_datasets(
    names: Iterable[str], data_dir: Path | None = None, files: bool = True
) -> tuple[str, ...]:
    """The registered names, lower-cased and once each, after checking that their files exist.

    Args:
        names: data set names, any case.
        data_dir: the benchmark data folder; None resolves it with `config.data_dir`.
        files: False checks the names only (a report rebuilt from run files reads no data).

    Raises:
        ValueError: a name is not registered.
        FileNotFoundError: the folder, or a file a named data set reads, is missing.
    """
    needs = {name.lower(): _registered(name).files for name in names}
    if files and any(needs.values()):
        folder = config.data_dir(data_dir)
        missing = [
            f"{file} ({key})"
            for key, files in needs.items()
            for file in files
            if not (folder / file).is_file()
        ]
        if missing:
            raise FileNotFoundError(
                f"the data folder {folder} lacks {', '.join(missing)} (--data-dir or "
                "ROFU_DATA_DIR: the benchmark data, see shared/data/SOURCES.md)"
            )
    return tuple(needs)


def load_bandit(source: str | ClassificationFile, data_dir: Path | None = None) -> Bandit:
    """The bandit of a registered data set, by (case-insensitive) name, or of a user's file.

    Args:
        source: a key of `DATASETS`, or a classification file of the user's.
        data_dir: the benchmark data folder; None resolves it with `config.data_dir`.

    Raises:
        ValueError: the name is not a known data set, or the file cannot be read
            (`rofu.replay.simulation.datafile.DataFileError`).
        FileNotFoundError: the data set needs files and the folder (or a file) is missing.
    """
    if isinstance(source, ClassificationFile):
        return source.load()
    dataset = _registered(source)
    return dataset.load(Path(data_dir or ".") if dataset.synthetic else config.data_dir(data_dir))
