"""The Showdown data set loaders, their registry, their conversions, and the synthetic bandits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rofu.replay import config
from rofu.replay.simulation.bandits import (
    Bandit,
    MLPBandit,
    PoolBandit,
    RotatedBandit,
    Stream,
    WheelBandit,
)
from rofu.replay.simulation.conversions import (
    FinancialBandit,
    class_means,
    label_codes,
    one_hot,
    zscore,
)
from rofu.replay.simulation.datafile import ClassificationFile
from rofu.replay.simulation.datasets import (
    DATASETS,
    check_datasets,
    load_adult,
    load_bandit,
    load_census,
)

SUBFOLDERS = {
    "mushroom": "mushroom",
    "statlog": "statlog_shuttle",
    "statlog-rotated": "statlog_shuttle",
    "covertype": "covertype",
    "adult": "adult",
    "census": "census1990",
    "jester": "jester",
    "financial": "financial",
}
CLASSIFICATION = ("statlog", "covertype", "adult", "census")


def _data_folder(subfolder: str = "") -> Path:
    try:
        folder = config.data_dir()
    except FileNotFoundError as error:
        pytest.skip(f"benchmark data folder absent: {error}")
    if subfolder and not (folder / subfolder).is_dir():
        pytest.skip(f"{subfolder} is not in {folder}")
    return folder


@pytest.fixture(scope="module")
def load() -> Callable[[str], Bandit]:
    """Loads each data set once per module (skips when its files are absent)."""
    cache: dict[str, Bandit] = {}

    def _load(name: str) -> Bandit:
        if name not in cache:
            dataset = DATASETS[name]
            folder = Path() if dataset.synthetic else _data_folder(SUBFOLDERS[name])
            cache[name] = dataset.load(folder)
        return cache[name]

    return _load


def _f64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array, dtype=np.float64)


def _pool(bandit: Bandit) -> np.ndarray:
    """(N, D) contexts of a pool-based bandit."""
    assert isinstance(bandit, PoolBandit | FinancialBandit)
    return bandit.contexts


# --- registry and load_bandit -------------------------------------------------------------


def test_datasets_registry_names_every_showdown_set() -> None:
    assert set(DATASETS) == {
        "mushroom", "statlog", "statlog-rotated", "covertype", "adult", "census", "jester",
        "financial", "wheel", "mlp", "resnet",
    }  # fmt: skip


def test_load_bandit_unknown_name_raises_naming_it() -> None:
    with pytest.raises(ValueError, match="unknown data set 'mnist'"):
        load_bandit("mnist")


def test_load_bandit_missing_folder_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROFU_DATA_DIR", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="absent"):
        load_bandit("mushroom")
    with pytest.raises(FileNotFoundError, match="absent"):
        load_bandit("statlog", tmp_path / "absent")


def test_load_bandit_synthetic_needs_no_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ROFU_DATA_DIR", str(tmp_path / "absent"))
    assert isinstance(load_bandit("wheel"), WheelBandit)
    assert isinstance(load_bandit("MLP"), MLPBandit)


def test_load_bandit_reads_the_given_folder() -> None:
    bandit = load_bandit("Mushroom", _data_folder("mushroom"))
    assert bandit.name == "mushroom"


def test_load_bandit_loads_a_classification_file(tmp_path: Path) -> None:
    path = tmp_path / "two.csv"
    path.write_text("0.5,a\n1.5,b\n2.5,a\n")
    bandit = load_bandit(ClassificationFile(path, -1, "file:two"), tmp_path / "absent")
    assert (bandit.name, bandit.context_dim, bandit.n_arms) == ("file:two", 1, 2)


def test_registry_synthetic_data_sets_are_those_without_files() -> None:
    assert {name for name, d in DATASETS.items() if d.synthetic} == {"wheel", "mlp", "resnet"}
    for name, dataset in DATASETS.items():
        assert all(not Path(file).is_absolute() for file in dataset.files), name


@pytest.mark.parametrize("name", [n for n, d in DATASETS.items() if not d.synthetic])
def test_registry_lists_every_file_its_loader_reads(name: str, tmp_path: Path) -> None:
    source = _data_folder(SUBFOLDERS[name])
    for file in DATASETS[name].files:  # a folder holding those files and nothing else
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).symlink_to(source / file)
    assert load_bandit(name, tmp_path).name == name


def test_check_datasets_lower_cases_and_drops_repeats(tmp_path: Path) -> None:
    assert check_datasets(["Wheel", "mlp", "wheel"], tmp_path / "absent") == ("wheel", "mlp")


def test_check_datasets_refuses_an_unknown_name_pointing_at_dataset_file() -> None:
    with pytest.raises(ValueError, match="unknown data set 'vehicle'.*--dataset-file"):
        check_datasets(["statlog", "vehicle"])


def test_check_datasets_names_each_missing_file_and_its_data_set(tmp_path: Path) -> None:
    (tmp_path / "adult").mkdir()
    (tmp_path / "adult" / "adult.data").write_text("")
    with pytest.raises(FileNotFoundError) as error:
        check_datasets(["adult", "statlog", "wheel"], tmp_path)
    message = str(error.value)
    assert "adult/adult.test (adult)" in message
    assert "statlog_shuttle/shuttle.trn (statlog)" in message
    assert "adult.data" not in message
    with pytest.raises(FileNotFoundError, match="absent"):
        check_datasets(["statlog"], tmp_path / "absent")


# --- every data set ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(DATASETS))
def test_stream_is_deterministic_per_seed(load: Callable[[str], Bandit], name: str) -> None:
    bandit = load(name)
    first, again, other = (bandit.stream(300, seed) for seed in (3, 3, 4))
    assert first.contexts.shape == (300, *bandit.context_shape)
    assert first.rewards.shape == first.means.shape == (300, bandit.n_arms)
    for field in ("contexts", "rewards", "means"):
        np.testing.assert_array_equal(getattr(first, field), getattr(again, field))
    assert not np.array_equal(first.contexts, other.contexts)
    assert bandit.notes
    assert "\n" not in bandit.notes


@pytest.mark.parametrize(
    ("name", "dim", "arms", "rows"),
    [
        ("mushroom", 117, 2, 8124),
        ("statlog", 9, 7, 43500),
        ("covertype", 54, 7, 92962),
        ("adult", 92, 14, 45222),
        ("census", 314, 8, 199),
        ("jester", 32, 8, 19181),
        ("financial", 21, 8, 3713),
    ],
)
def test_loader_shapes(
    load: Callable[[str], Bandit], name: str, dim: int, arms: int, rows: int
) -> None:
    bandit = load(name)
    assert (bandit.context_dim, bandit.n_arms) == (dim, arms)
    assert _pool(bandit).shape == (rows, dim)


@pytest.mark.parametrize("name", CLASSIFICATION)
def test_classification_rewards_are_one_hot_of_the_class(
    load: Callable[[str], Bandit], name: str
) -> None:
    bandit = load(name)
    assert isinstance(bandit, PoolBandit)
    assert set(np.unique(bandit.means)) == {0.0, 1.0}
    np.testing.assert_array_equal(bandit.means.sum(axis=1), 1.0)
    stream = bandit.stream(200, 0)
    np.testing.assert_array_equal(stream.rewards, stream.means)


# --- per data set --------------------------------------------------------------------------


def test_mushroom_edible_row_pays_five_and_context_is_one_hot(
    load: Callable[[str], Bandit],
) -> None:
    bandit = load("mushroom")
    assert isinstance(bandit, PoolBandit)
    # file row 0 is poisonous ('p,x,s,n,...'), row 1 edible ('e,x,s,y,...')
    np.testing.assert_array_equal(bandit.means[0], [0.0, -15.0])
    np.testing.assert_array_equal(bandit.means[1], [0.0, 5.0])
    assert set(np.unique(bandit.contexts)) == {0.0, 1.0}
    np.testing.assert_array_equal(bandit.contexts.sum(axis=1), 22.0)  # one 1 per attribute


def test_mushroom_poisonous_pays_five_or_minus_35_and_minus_15_expected(
    load: Callable[[str], Bandit],
) -> None:
    stream = load("mushroom").stream(20_000, 0)
    poisonous = stream.means[:, 1] == -15.0
    edible = stream.means[:, 1] == 5.0
    assert (poisonous | edible).all()
    np.testing.assert_array_equal(stream.rewards[:, 0], 0.0)
    np.testing.assert_array_equal(stream.rewards[edible, 1], 5.0)
    eat_poison = stream.rewards[poisonous, 1]
    assert set(np.unique(eat_poison)) == {-35.0, 5.0}
    assert eat_poison.mean() == pytest.approx(-15.0, abs=1.0)


def test_statlog_is_zscored_shuttle_trn(load: Callable[[str], Bandit]) -> None:
    bandit = load("statlog")
    assert isinstance(bandit, PoolBandit)
    raw = np.loadtxt(_data_folder() / "statlog_shuttle" / "shuttle.trn")
    np.testing.assert_allclose(bandit.contexts, zscore(raw[:, :-1]), rtol=1e-6, atol=1e-6)
    assert bandit.means[0].argmax() == 1  # first row '50 21 77 0 28 0 27 48 22 2': class 2
    np.testing.assert_array_equal(bandit.means.sum(axis=0), [34108, 37, 132, 6748, 2458, 6, 11])


@pytest.mark.parametrize(("name", "columns"), [("statlog", 9), ("covertype", 54), ("adult", 6)])
def test_zscored_columns_have_mean_zero_and_unit_std(
    load: Callable[[str], Bandit], name: str, columns: int
) -> None:
    contexts = _f64(_pool(load(name))[:, :columns])
    std = contexts.std(axis=0)
    np.testing.assert_allclose(contexts.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(std[std > 0], 1.0, atol=1e-4)


def test_covertype_zscores_the_binary_columns_too(load: Callable[[str], Bandit]) -> None:
    bandit = load("covertype")
    assert isinstance(bandit, PoolBandit)
    wilderness = _f64(_pool(bandit)[:, 10])
    assert len(np.unique(wilderness)) == 2
    assert not np.isin(wilderness, [0.0, 1.0]).all()
    assert bandit.means[0].argmax() == 0  # the file's first row is class 1
    np.testing.assert_array_equal(
        bandit.means.sum(axis=0),
        [33894, 45328, 5721, 439, 1519, 2779, 3282],
    )


def test_adult_labels_occupation_and_one_hots_the_rest(load: Callable[[str], Bandit]) -> None:
    bandit = load("adult")
    assert isinstance(bandit, PoolBandit)
    # sorted occupations: Adm-clerical 0, ..., Exec-managerial 3; rows 0, 1 are adult.data's
    assert bandit.means[0].argmax() == 0
    assert bandit.means[1].argmax() == 3
    dummies = bandit.contexts[:, 6:]
    assert set(np.unique(dummies)) == {0.0, 1.0}
    np.testing.assert_array_equal(dummies.sum(axis=1), 8.0)  # 8 categorical columns


def test_adult_zscore_all_scales_the_dummies(load: Callable[[str], Bandit]) -> None:
    bandit = load_adult(_data_folder("adult"), zscore_all=True)
    contexts = _f64(bandit.contexts)
    assert contexts.shape == _pool(load("adult")).shape
    np.testing.assert_allclose(contexts.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(contexts.std(axis=0), 1.0, atol=1e-4)


def test_census_is_partial_with_the_classes_that_occur(load: Callable[[str], Bandit]) -> None:
    bandit = load("census")
    assert isinstance(bandit, PoolBandit)
    assert "PARTIAL" in bandit.notes
    assert "a 199-row pool" in bandit.notes
    # dOccup 0..6 and 8 occur; 8 becomes arm 7; the first row has dOccup 3
    np.testing.assert_array_equal(bandit.means.sum(axis=0), [85, 30, 38, 14, 3, 13, 15, 1])
    assert bandit.means[0].argmax() == 3
    np.testing.assert_array_equal(bandit.contexts.sum(axis=1), 67.0)  # one 1 per column
    scaled = _f64(load_census(_data_folder("census1990"), zscore_all=True).contexts)
    np.testing.assert_allclose(scaled.mean(axis=0), 0.0, atol=1e-4)


def test_jester_rewards_are_the_ratings_of_the_last_8_jokes(load: Callable[[str], Bandit]) -> None:
    bandit = load("jester")
    assert isinstance(bandit, PoolBandit)
    ratings = np.load(_data_folder() / "jester" / "jester_data_40jokes_19181users.npy")
    np.testing.assert_array_equal(bandit.means, ratings[:, 32:])
    np.testing.assert_array_equal(bandit.contexts, ratings[:, :32].astype(np.float32))
    stream = bandit.stream(50, 1)
    for context, rewards in zip(stream.contexts, stream.rewards, strict=True):
        rows = np.flatnonzero((bandit.contexts == context).all(axis=1))
        assert any(np.array_equal(ratings[row, 32:], rewards) for row in rows)


def test_financial_means_are_x_dot_beta_with_unit_betas(load: Callable[[str], Bandit]) -> None:
    bandit = load("financial")
    assert isinstance(bandit, FinancialBandit)
    raw = np.loadtxt(_data_folder() / "financial" / "raw_stock_contexts", skiprows=1)
    np.testing.assert_array_equal(bandit.contexts, raw.astype(np.float32))
    beta = bandit.betas(5)
    assert beta.shape == (21, 8)
    np.testing.assert_allclose(np.linalg.norm(beta, axis=0), 1.0)
    np.testing.assert_array_equal(beta, bandit.betas(5))
    assert not np.allclose(beta, bandit.betas(6))
    stream = bandit.stream(100, 5)
    np.testing.assert_allclose(stream.means, _f64(stream.contexts) @ beta, rtol=1e-12)


def test_financial_noise_std_grows_with_the_arm(load: Callable[[str], Bandit]) -> None:
    stream = load("financial").stream(20_000, 0)
    std = (stream.rewards - stream.means).std(axis=0)
    np.testing.assert_allclose(std, 0.01 * np.arange(1, 9), rtol=0.05)
    assert (np.diff(std) > 0).all()


# --- conversions ---------------------------------------------------------------------------


def test_zscore_centres_and_guards_constant_columns() -> None:
    x = np.array([[1.0, 7.0], [3.0, 7.0], [5.0, 7.0]])
    z = zscore(x)
    np.testing.assert_allclose(z[:, 0], [-np.sqrt(1.5), 0.0, np.sqrt(1.5)])
    np.testing.assert_array_equal(z[:, 1], 0.0)


def test_one_hot_sorts_categories_per_column_in_column_order() -> None:
    frame = pd.DataFrame({"a": ["y", "x", "y"], "b": [2, 2, 1]})
    np.testing.assert_array_equal(one_hot(frame), [[0, 1, 0, 1], [1, 0, 0, 1], [0, 1, 1, 0]])
    with pytest.raises(ValueError, match="missing"):
        one_hot(pd.DataFrame({"a": ["x", None]}))


def test_label_codes_and_class_means() -> None:
    codes, classes = label_codes(np.array(["b", "a", "c", "a"]))
    np.testing.assert_array_equal(codes, [1, 0, 2, 0])
    np.testing.assert_array_equal(classes, ["a", "b", "c"])
    np.testing.assert_array_equal(class_means(codes, 3)[0], [0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="labels must lie"):
        class_means(codes, 2)


# --- bandits.py ----------------------------------------------------------------------------


def test_wheel_optimal_arm_by_quadrant_outside_delta_arm_0_inside() -> None:
    bandit = WheelBandit(delta=0.5)
    stream = bandit.stream(4000, 0)
    x, y = _f64(stream.contexts).T
    radius = np.hypot(x, y)
    assert radius.max() <= 1.0 + 1e-6
    quadrant = np.select([(x > 0) & (y > 0), (x < 0) & (y > 0), (x > 0) & (y < 0)], [1, 2, 3], 4)
    outside, inside = radius > 0.5 + 1e-6, radius < 0.5 - 1e-6
    assert outside.sum() > 1000
    assert inside.sum() > 500
    best = stream.means.argmax(axis=1)
    np.testing.assert_array_equal(best[outside], quadrant[outside])
    np.testing.assert_array_equal(best[inside], 0)
    np.testing.assert_array_equal(stream.means[outside].max(axis=1), 50.0)
    np.testing.assert_allclose((stream.rewards - stream.means).std(), 0.01, rtol=0.05)


def test_wheel_shapes_determinism_and_delta_check() -> None:
    bandit = WheelBandit()
    first, again = bandit.stream(100, 2), bandit.stream(100, 2)
    assert first.contexts.shape == (100, 2)
    assert first.rewards.shape == (100, 5)
    np.testing.assert_array_equal(first.rewards, again.rewards)
    assert not np.array_equal(first.contexts, bandit.stream(100, 3).contexts)
    with pytest.raises(ValueError, match="delta"):
        WheelBandit(delta=1.0)


def test_mlp_shapes_noise_and_seeded_network() -> None:
    bandit = MLPBandit()
    stream = bandit.stream(5000, 0)
    assert stream.contexts.shape == (5000, 10)
    assert stream.means.shape == (5000, 10)
    np.testing.assert_array_equal(stream.means, bandit.stream(5000, 0).means)
    np.testing.assert_allclose((stream.rewards - stream.means).std(), 0.05, rtol=0.05)
    other = bandit.stream(5000, 1)
    assert not np.allclose(stream.means.std(axis=0), other.means.std(axis=0))


def test_stream_rejects_disagreeing_shapes_and_non_finite_values() -> None:
    contexts, table = np.zeros((3, 2), np.float32), np.zeros((3, 4))
    assert Stream(contexts, table, table).rounds == 3
    with pytest.raises(ValueError, match="shapes disagree"):
        Stream(contexts, table, np.zeros((3, 5)))
    with pytest.raises(ValueError, match="shapes disagree"):
        Stream(np.zeros((2, 2), np.float32), table, table)
    bad = table.copy()
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match="rewards contain non-finite"):
        Stream(contexts, bad, table)


def test_pool_bandit_rejects_empty_or_disagreeing_pools() -> None:
    with pytest.raises(ValueError, match="empty"):
        PoolBandit("p", np.zeros((0, 2)), np.zeros((0, 3)))
    with pytest.raises(ValueError, match="disagree"):
        PoolBandit("p", np.zeros((4, 2)), np.zeros((5, 3)))
    stream = PoolBandit("p", np.eye(4), np.eye(4)[:, :3]).stream(20, 0)
    np.testing.assert_array_equal(stream.rewards, stream.means)
    np.testing.assert_array_equal(stream.means, stream.contexts[:, :3])  # rows stay aligned


def test_statlog_rotated_rotates_the_arms_half_way_on_statlogs_rows(
    load: Callable[[str], Bandit],
) -> None:
    plain, rotated = load("statlog").stream(400, 5), load("statlog-rotated").stream(400, 5)
    np.testing.assert_array_equal(plain.contexts, rotated.contexts)  # common random numbers
    np.testing.assert_array_equal(plain.means[:200], rotated.means[:200])
    arms = load("statlog").n_arms
    for a in range(arms):  # arm a pays what arm a + 1 paid
        np.testing.assert_array_equal(rotated.means[200:, a], plain.means[200:, (a + 1) % arms])
        np.testing.assert_array_equal(rotated.rewards[200:, a], plain.rewards[200:, (a + 1) % arms])
    assert not np.array_equal(plain.means[200:], rotated.means[200:])


def test_rotated_bandit_refuses_a_rotation_outside_the_run() -> None:
    for at in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="at must be in"):
            RotatedBandit(WheelBandit(), at=at)
