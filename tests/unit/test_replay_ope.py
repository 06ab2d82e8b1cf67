"""Off-policy evaluation: estimators on synthetic logs with a known truth, OBD loading, run_ope."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rofu.models.policies import Uniform
from rofu.models.scores import Decision, Scores
from rofu.replay.config import data_dir
from rofu.replay.ope import (
    dr_estimate,
    evaluate,
    ips_estimate,
    policy_pass,
    ratio_estimate,
    replay_estimate,
)
from rofu.replay.ope_cli import run_ope
from rofu.replay.simulation.obd import CandidateSubset, LoggedBandit, item_ctr_table, load_obd

# Three equally likely contexts, four arms, Bernoulli rewards.
MEANS = np.array([[0.2, 0.7, 0.4, 0.1], [0.6, 0.3, 0.2, 0.5], [0.1, 0.2, 0.3, 0.9]])  # (C, K)
TARGET = np.array([1, 3, 0])  # a deterministic policy: context -> arm
TRUTH = float(MEANS[np.arange(3), TARGET].mean())  # 0.4333
UNIFORM_LOGGING = np.full((3, 4), 0.25)
# Logs the target's arm often where it pays (context 0) and rarely where it does not (2).
SKEWED_LOGGING = np.array(
    [[0.1, 0.7, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25], [0.05, 0.45, 0.45, 0.05]]
)


def synthetic_log(n: int, seed: int, logging: np.ndarray = UNIFORM_LOGGING) -> LoggedBandit:
    """A log of n rows from `logging` (C, K) with rewards from MEANS."""
    rng = np.random.default_rng(seed)
    c = rng.integers(3, size=n)
    a = (rng.random(n)[:, None] > logging[c].cumsum(axis=1)).sum(axis=1).clip(max=3)
    r = (rng.random(n) < MEANS[c, a]).astype(np.float64)
    return LoggedBandit(
        contexts=np.eye(3, dtype=np.float32)[c],
        actions=a.astype(np.int64),
        rewards=r,
        propensities=logging[c, a],
        positions=np.ones(n, dtype=np.int64),
        timestamps=np.arange(n).astype("datetime64[ns]"),
        n_items=4,
        feature_names=("c0", "c1", "c2"),
        name="synthetic",
    )


def target_picks(logged: LoggedBandit) -> np.ndarray:
    return TARGET[logged.contexts.argmax(axis=1)]


class FixedPolicy:
    """The TARGET policy; records the batches it is updated with."""

    name = "Fixed"

    def __init__(self, context_dim: int, n_arms: int) -> None:
        self.n_arms = n_arms
        self.updates: list = []

    def select(self, contexts: torch.Tensor, candidates: torch.Tensor | None = None) -> Decision:
        arms = torch.as_tensor(TARGET)[contexts.argmax(dim=1)]
        zeros = torch.zeros(contexts.shape[0], self.n_arms, dtype=torch.float64)
        return Decision(arms, torch.ones(len(arms), dtype=torch.float64), Scores(zeros, zeros))

    def update(self, batch) -> dict[str, float]:
        self.updates.append(batch)
        return {}


class LeaderPolicy:
    """Deterministic learner: per context, the arm with the best smoothed click rate."""

    name = "Leader"

    def __init__(self, context_dim: int, n_arms: int) -> None:
        self.n_arms = n_arms
        self.clicks = np.zeros((context_dim, n_arms))
        self.pulls = np.zeros((context_dim, n_arms))

    def select(self, contexts: torch.Tensor, candidates: torch.Tensor | None = None) -> Decision:
        c = contexts.argmax(dim=1).numpy()
        arms = torch.as_tensor(((self.clicks[c] + 1) / (self.pulls[c] + 2)).argmax(axis=1))
        zeros = torch.zeros(len(c), self.n_arms, dtype=torch.float64)
        return Decision(arms, torch.ones(len(c), dtype=torch.float64), Scores(zeros, zeros))

    def update(self, batch) -> dict[str, float]:
        for x, a, r in zip(batch.x, batch.arms, batch.rewards, strict=True):
            self.pulls[int(x.argmax()), int(a)] += 1
            self.clicks[int(x.argmax()), int(a)] += float(r)
        return {}


def covered(estimate, truth: float) -> bool:
    return estimate.ci_low <= truth <= estimate.ci_high


def test_replay_ope_estimators_have_nominal_coverage_on_uniform_logs():
    hits = {"replay": 0, "ips": 0, "dr": 0}
    values: dict[str, list[float]] = {name: [] for name in hits}
    reps = 300
    for seed in range(reps):
        logged = synthetic_log(1000, seed)
        picks = target_picks(logged)
        matched = picks == logged.actions
        r, p = logged.rewards, logged.propensities
        table = item_ctr_table(logged, seed=seed)
        estimates = {
            "replay": replay_estimate(r, matched),
            "ips": ips_estimate(r, matched, p),
            "dr": dr_estimate(r, matched, p, table.at(logged.actions), table.at(picks)),
        }
        for name, estimate in estimates.items():
            hits[name] += covered(estimate, TRUTH)
            values[name].append(estimate.value)
    for name in hits:
        assert 0.91 <= hits[name] / reps <= 0.985, (name, hits[name])
        spread = np.std(values[name]) / np.sqrt(reps)
        assert abs(np.mean(values[name]) - TRUTH) < 4 * spread, name


def test_replay_ope_evaluate_recovers_deterministic_and_stochastic_policies():
    logged = synthetic_log(20_000, seed=1)
    fixed = FixedPolicy(3, 4)
    result = evaluate({"fixed": lambda d, a: fixed, "uniform": lambda d, a: Uniform(d, a)}, logged)
    matched = target_picks(logged) == logged.actions
    for name, truth in (("fixed", TRUTH), ("uniform", float(MEANS.mean()))):
        assert set(result[name]) == {"replay", "ips", "dr"}
        for estimate in result[name].values():
            assert covered(estimate, truth), (name, estimate)
            assert abs(estimate.value - truth) < 0.03
    assert result["fixed"]["ips"].n_matched == int(matched.sum())
    assert result["fixed"]["ips"].matched_reward == float(logged.rewards[matched].sum())
    # The policy learned from the matched rows only, one row per update, in time order.
    learned = torch.cat([b.rewards for b in fixed.updates]).numpy()
    assert len(fixed.updates) == int(matched.sum())
    np.testing.assert_array_equal(learned, logged.rewards[matched])


def test_replay_ope_ips_is_unbiased_under_skewed_logging_where_the_naive_mean_is_not():
    ips, naive = [], []
    for seed in range(200):
        logged = synthetic_log(2000, seed, SKEWED_LOGGING)
        matched = target_picks(logged) == logged.actions
        ips.append(ips_estimate(logged.rewards, matched, logged.propensities).value)
        naive.append(replay_estimate(logged.rewards, matched).value)
    assert abs(np.mean(ips) - TRUTH) < 4 * np.std(ips) / np.sqrt(len(ips))
    assert np.mean(naive) > TRUTH + 0.1  # over-weights context 0, where the target pays


def test_replay_ope_dr_with_a_perfect_model_has_lower_variance_than_ips():
    ips, dr, widths = [], [], []
    for seed in range(200):
        logged = synthetic_log(1000, seed)
        c, picks = logged.contexts.argmax(axis=1), target_picks(logged)
        matched = picks == logged.actions
        r, p = logged.rewards, logged.propensities
        ips_value = ips_estimate(r, matched, p)
        dr_value = dr_estimate(r, matched, p, MEANS[c, logged.actions], MEANS[c, picks])
        ips.append(ips_value.value)
        dr.append(dr_value.value)
        widths.append((dr_value.ci_high - dr_value.ci_low) / (ips_value.ci_high - ips_value.ci_low))
    assert np.var(dr) < 0.8 * np.var(ips)  # 0.58 at these seeds
    assert max(widths) < 1.0
    assert abs(np.mean(dr) - TRUTH) < 4 * np.std(dr) / np.sqrt(len(dr))


def test_replay_ope_bootstrap_interval_agrees_with_normal_and_is_seeded():
    logged = synthetic_log(20_000, seed=2)
    matched = target_picks(logged) == logged.actions
    terms = logged.rewards * matched / logged.propensities
    ones = np.ones_like(terms)
    value, low, high = ratio_estimate(terms, ones)
    boot = ratio_estimate(terms, ones, ci="bootstrap", rng=np.random.default_rng(5))
    half = (high - low) / 2
    assert boot[0] == value
    assert abs(boot[1] - low) < 0.15 * half
    assert abs(boot[2] - high) < 0.15 * half
    assert ratio_estimate(terms, ones, ci="bootstrap", rng=np.random.default_rng(5)) == boot
    assert ratio_estimate(terms, ones, ci="bootstrap", rng=np.random.default_rng(6)) != boot
    # Replay's ratio: bootstrap over all rows approximates the matched rows' standard error.
    m = matched.astype(float)
    normal = ratio_estimate(logged.rewards * m, m)
    boot = ratio_estimate(logged.rewards * m, m, ci="bootstrap", rng=np.random.default_rng(5))
    assert abs(boot[2] - normal[2]) < 0.15 * (normal[2] - normal[1]) / 2


def test_replay_ope_policy_pass_in_chunks_equals_a_row_by_row_loop():
    logged = synthetic_log(3000, seed=3)
    chunked = LeaderPolicy(3, 4)
    picks = policy_pass(chunked, logged, chunk_size=7)
    naive, expected = LeaderPolicy(3, 4), []
    for i in range(len(logged)):
        arm = int(naive.select(torch.tensor(logged.contexts[i : i + 1])).arms[0])
        expected.append(arm)
        if arm == logged.actions[i]:
            naive.update(logged.transitions(slice(i, i + 1)))
    np.testing.assert_array_equal(picks, expected)
    np.testing.assert_array_equal(chunked.pulls, naive.pulls)
    assert len(set(expected)) > 1  # it learned: its choice changed over the log


def test_replay_ope_refuses_replay_on_a_non_uniform_log():
    logged = synthetic_log(500, seed=4, logging=SKEWED_LOGGING)
    assert not logged.uniform
    with pytest.raises(ValueError, match="uniform"):
        evaluate({"fixed": FixedPolicy}, logged, estimators=("replay",))
    assert set(evaluate({"fixed": FixedPolicy}, logged)["fixed"]) == {"ips", "dr"}


def test_replay_ope_candidate_subset_offers_k_random_items_per_row():
    seen: list[torch.Tensor] = []

    class Recorder(FixedPolicy):
        def select(self, contexts, candidates=None):
            seen.append(candidates)
            arms = candidates.float().argmax(dim=1)
            return Decision(
                arms, torch.ones(len(arms)), Scores(candidates.float(), candidates.float())
            )

    policy = CandidateSubset(Recorder(3, 10), 3, seed=0)
    policy.select(torch.zeros(400, 3))
    assert (seen[0].sum(dim=1) == 3).all()
    assert (seen[0].float().mean(dim=0) - 0.3).abs().max() < 0.1  # every item as often
    allowed = torch.zeros(400, 10, dtype=torch.bool)
    allowed[:, :2] = True
    policy.select(torch.zeros(400, 3), allowed)
    assert not (seen[1] & ~allowed).any()
    assert seen[1].any(dim=1).all()


@pytest.fixture(scope="module")
def obd_root():
    try:
        root = data_dir()
    except FileNotFoundError:
        pytest.skip("benchmark data folder not found")
    if not (root / "open_bandit_dataset_sample").is_dir():
        pytest.skip("Open Bandit Dataset sample not staged")
    return root


def test_replay_ope_load_obd_random_log(obd_root):
    logged = load_obd("random", "all", obd_root)
    assert len(logged) == 10_000
    assert logged.n_items == 80
    assert logged.contexts.shape == (10_000, logged.context_dim) == (10_000, 29)
    assert set(logged.actions.tolist()) == set(range(80))
    # Uniform logging: every item has probability 1/80 at every position.
    np.testing.assert_allclose(logged.propensities, 1 / 80, rtol=1e-9)
    assert logged.uniform
    assert set(np.unique(logged.rewards)) == {0.0, 1.0}
    assert logged.rewards.sum() == 38
    assert set(logged.positions.tolist()) == {1, 2, 3}
    assert np.all(np.diff(logged.timestamps.astype(np.int64)) >= 0)
    # One-hot blocks: four user features and the position.
    np.testing.assert_array_equal(logged.contexts.sum(axis=1), 5.0)
    assert len(logged.at_position(1)) == 3322


def test_replay_ope_load_obd_bts_shares_the_encoding(obd_root):
    random_log, bts = load_obd("random", "all", obd_root), load_obd("bts", "all", obd_root)
    assert bts.feature_names == random_log.feature_names
    assert len(bts) == 10_000
    assert not bts.uniform
    assert np.all((bts.propensities > 0) & (bts.propensities <= 1))
    assert set(np.unique(bts.rewards)) <= {0.0, 1.0}
    men = load_obd("random", "men", obd_root, affinity=True)
    assert men.n_items == 34
    assert men.actions.max() == 33
    assert men.context_dim == load_obd("random", "men", obd_root).context_dim + 34
    with pytest.raises(ValueError, match="campaign"):
        load_obd("random", "kids", obd_root)  # type: ignore[arg-type]


def test_replay_ope_run_ope_writes_markdown_and_json(obd_root, tmp_path):
    names = ["Uniform", "EpsilonGreedy", "LinUCB", "ROFU"]
    figures = run_ope(names, "random", "all", obd_root, 0, tmp_path, rows=1000)
    written = json.loads((tmp_path / "ope_random_all.json").read_text())
    assert written == json.loads(json.dumps(figures))
    assert figures["rows"] == 1000
    assert list(figures["policies"]) == names
    head = load_obd("random", "all", obd_root).head(1000)
    assert figures["behavior_value"]["value"] == pytest.approx(head.rewards.mean())
    for result in figures["policies"].values():
        assert set(result) == {"replay", "ips", "dr"}
        assert 0 < result["ips"]["n_matched"] < 1000
    text = (tmp_path / "ope_random_all.md").read_text()
    assert "| policy | replay | ips | dr |" in text
    assert all(f"| {name} | " in text for name in names)
    bts = run_ope(["Uniform"], "bts", "men", obd_root, 1, tmp_path, rows=500)
    assert set(bts["policies"]["Uniform"]) == {"ips", "dr"}
    assert "replay: not computed" in (tmp_path / "ope_bts_men.md").read_text()
    with pytest.raises(ValueError, match="policies"):
        run_ope(["Oracle"], "random", "all", obd_root, 0, tmp_path)
