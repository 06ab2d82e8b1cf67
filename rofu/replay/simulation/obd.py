"""The Open Bandit Dataset sample: the log as a `LoggedBandit`, and models sized for it.

Each of the 10 000 rows of `{behavior}/{campaign}/{campaign}.csv` is one impression slot:
the item shown at one of three positions, whether it was clicked, and the behaviour
policy's marginal probability of showing that item at that position (`propensity_score`).
Rows are pooled over positions, each one an independent decision with its logged
propensity, and the position (one-hot) is part of the context. This is Open Bandit
Pipeline's estimand (its IPW weights row i by pi(a_i | x_i, pos_i) / pscore_i): the
propensity is marginal per position, so nothing needs the other slots of the impression,
and the sample could not supply them anyway (9 982 of the 10 000 timestamps of
random/all are distinct, so rows are mostly from different impressions). Evaluate one
position alone with `LoggedBandit.at_position`.

`item_ctr_table` (DR's reward model) and `default_policies` (what `rofu.replay.ope_cli.run_ope`
evaluates) are sized for a 10k-row log of up to 80 items with ~40 clicks, where a policy
learns from ~N / A matched rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import torch

from rofu.models.data import Transitions
from rofu.models.networks import RewardNetConfig
from rofu.models.policies import EpsilonGreedy, LinUCB, Policy, RofuPolicy, TrainSchedule, Uniform
from rofu.models.rofu import RofuConfig
from rofu.models.scores import Decision
from rofu.models.training import FitConfig
from rofu.models.validation import check_choice, check_int
from rofu.replay.config import data_dir as default_data_dir

BEHAVIORS = ("random", "bts")
CAMPAIGNS = ("all", "men", "women")
USER_FEATURES = tuple(f"user_feature_{j}" for j in range(4))
POSITIONS = (1, 2, 3)
PolicyFactory = Callable[[int, int], Policy]


@dataclass(frozen=True)
class LoggedBandit:
    """Logged bandit feedback in time order.

    Attributes:
        contexts: (N, D) float32 features of each row.
        actions: (N,) int64 logged item, 0..n_items-1.
        rewards: (N,) float64 observed reward (click 0/1 for OBD).
        propensities: (N,) float64 behaviour policy's probability of the logged item, in (0, 1].
        positions: (N,) int64 slot of the row (1..3 for OBD).
        timestamps: (N,) datetime64[ns] (UTC), non-decreasing.
        n_items: A, the number of items any policy chooses among.
        feature_names: D names, one per context column.
        name: where the log came from, e.g. `obd/random/all`.
    """

    contexts: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    propensities: np.ndarray
    positions: np.ndarray
    timestamps: np.ndarray
    n_items: int
    feature_names: tuple[str, ...]
    name: str = "log"

    def __post_init__(self) -> None:
        n = self.actions.shape[0]
        for f in ("contexts", "actions", "rewards", "propensities", "positions", "timestamps"):
            if getattr(self, f).shape[0] != n:
                raise ValueError(f"{f} has {getattr(self, f).shape[0]} rows, actions has {n}")
        if self.contexts.ndim != 2 or self.contexts.shape[1] != len(self.feature_names):
            raise ValueError(f"contexts must be (N, {len(self.feature_names)})")
        if n and (self.actions.min() < 0 or self.actions.max() >= self.n_items):
            raise ValueError(f"actions must lie in 0..{self.n_items - 1}")
        if not (np.all(self.propensities > 0) and np.all(self.propensities <= 1)):
            raise ValueError("propensities must lie in (0, 1]")
        if not np.isfinite(self.rewards).all() or not np.isfinite(self.contexts).all():
            raise ValueError("rewards and contexts must be finite")
        if np.any(np.diff(self.timestamps.astype(np.int64)) < 0):
            raise ValueError("timestamps must be non-decreasing (rows in time order)")

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    @property
    def context_dim(self) -> int:
        """D."""
        return int(self.contexts.shape[1])

    @property
    def uniform(self) -> bool:
        """Whether every logged item had probability 1 / n_items (a uniform-random log)."""
        return bool(np.allclose(self.propensities, 1.0 / self.n_items, rtol=1e-6, atol=0.0))

    def subset(self, index: np.ndarray | slice) -> LoggedBandit:
        """The rows picked by an index, mask or slice (order kept)."""
        arrays = {f.name: getattr(self, f.name)[index] for f in fields(self) if f.name in _ROWS}
        return LoggedBandit(
            **arrays, n_items=self.n_items, feature_names=self.feature_names, name=self.name
        )

    def head(self, rows: int) -> LoggedBandit:
        """The first `rows` rows in time order."""
        return self.subset(slice(0, rows))

    def at_position(self, position: int) -> LoggedBandit:
        """Only the rows logged at one position (OBP's per-position evaluation)."""
        return self.subset(self.positions == position)

    def transitions(self, rows: slice) -> Transitions:
        """Rows as a `Transitions` batch for `Policy.update`."""
        return Transitions(
            torch.tensor(self.contexts[rows], dtype=torch.float32),
            torch.tensor(self.actions[rows], dtype=torch.int64),
            torch.tensor(self.rewards[rows], dtype=torch.float32),
        )


_ROWS = ("contexts", "actions", "rewards", "propensities", "positions", "timestamps")


def load_obd(
    behavior: Literal["random", "bts"],
    campaign: Literal["all", "men", "women"],
    data_dir: Path | str | None = None,
    *,
    affinity: bool = False,
) -> LoggedBandit:
    """Load one OBD sample log as a `LoggedBandit`, sorted by timestamp.

    Contexts are the one-hot user features (categories fitted on the union of the random
    and bts logs of the campaign, so both logs share one encoding: D = 26 for `all`) then
    the one-hot position (3). `affinity=True` appends the user-item affinity counts (one
    per item); they are off by default: non-zero in under 5% of rows, and they add A
    columns to every per-arm model (LinUCB keeps A D x D matrices).

    Args:
        behavior: `random` (uniform logging) or `bts` (Bernoulli Thompson sampling).
        campaign: `all` (80 items), `men` (34) or `women` (46).
        data_dir: the benchmark data folder (`rofu.replay.config.data_dir` when None).
        affinity: append the `user-item_affinity_*` columns.

    Raises:
        ValueError: on an unknown behavior or campaign.
        FileNotFoundError: the data folder or a log file is missing.
    """
    check_choice("behavior", behavior, BEHAVIORS)
    check_choice("campaign", campaign, CAMPAIGNS)
    root = default_data_dir(data_dir) / "open_bandit_dataset_sample"
    frame = _read(root, behavior, campaign).sort_values("timestamp", kind="stable")
    categories = _categories(root, campaign)
    blocks = [_one_hot(frame[c].astype(str).to_numpy(), categories[c]) for c in USER_FEATURES]
    blocks.append(_one_hot(frame["position"].to_numpy(), np.array(POSITIONS)))
    names = [f"{c}={v}" for c in USER_FEATURES for v in categories[c]]
    names += [f"position={p}" for p in POSITIONS]
    if affinity:
        columns = [c for c in frame.columns if c.startswith("user-item_affinity_")]
        blocks.append(frame[columns].to_numpy(np.float32))
        names += columns
    n_items = len(pd.read_csv(root / behavior / campaign / "item_context.csv", index_col=0))
    stamps = pd.to_datetime(frame["timestamp"], utc=True)
    return LoggedBandit(
        contexts=np.concatenate(blocks, axis=1).astype(np.float32),
        actions=frame["item_id"].to_numpy(np.int64, copy=True),
        rewards=frame["click"].to_numpy(np.float64, copy=True),
        propensities=frame["propensity_score"].to_numpy(np.float64, copy=True),
        positions=frame["position"].to_numpy(np.int64, copy=True),
        timestamps=stamps.dt.tz_localize(None).to_numpy("datetime64[ns]"),
        n_items=n_items,
        feature_names=tuple(names),
        name=f"obd/{behavior}/{campaign}",
    )


def _read(
    root: Path, behavior: str, campaign: str, columns: list[str] | None = None
) -> pd.DataFrame:
    path = root / behavior / campaign / f"{campaign}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"Open Bandit Dataset log {path} not found")
    if columns is not None:
        return pd.read_csv(path, usecols=columns)
    return pd.read_csv(path, index_col=0)


def _categories(root: Path, campaign: str) -> dict[str, np.ndarray]:
    """Sorted categories of each user feature over the random and bts logs of a campaign."""
    both = pd.concat([_read(root, b, campaign, list(USER_FEATURES)) for b in BEHAVIORS])
    return {c: np.sort(both[c].astype(str).unique()) for c in USER_FEATURES}


def _one_hot(values: np.ndarray, categories: np.ndarray) -> np.ndarray:
    """(N,) values -> (N, C) float32 indicators of `categories` (sorted)."""
    index = np.searchsorted(categories, values)
    index = np.clip(index, 0, len(categories) - 1)
    if not np.all(categories[index] == values):
        raise ValueError("a value is missing from the fitted categories")
    out = np.zeros((len(values), len(categories)), dtype=np.float32)
    out[np.arange(len(values)), index] = 1.0
    return out


@dataclass(frozen=True)
class RewardTable:
    """A cross-fitted reward model q(x, a) = q[fold of row, a].

    Attributes:
        fold: (N,) int64 fold of each row. q: (F, A) model fitted on the other folds.
    """

    fold: np.ndarray
    q: np.ndarray

    def at(self, items: np.ndarray) -> np.ndarray:
        """(N,) items, one per row -> (N,) q of that row's item."""
        values: np.ndarray = self.q[self.fold, items]
        return values


def item_ctr_table(
    logged: LoggedBandit, *, folds: int = 2, prior: float = 100.0, seed: int = 0
) -> RewardTable:
    """Per-item CTR shrunk to the overall CTR: (clicks_a + prior mu) / (shown_a + prior).

    Context-free: with ~40 clicks in 10 000 rows a per-item regression has nothing to fit.
    Each row's q comes from the other folds (cross-fitting), so DR's correction term does
    not see its own reward; `folds=1` fits on all rows.
    """
    check_int("folds", folds, low=1)
    n = len(logged)
    fold = np.random.default_rng(seed).permutation(n) % folds
    q = np.empty((folds, logged.n_items))
    for k in range(folds):
        train = fold != k if folds > 1 else np.ones(n, dtype=bool)
        a, r = logged.actions[train], logged.rewards[train]
        mu = float(r.mean()) if r.size else 0.0
        shown = np.bincount(a, minlength=logged.n_items)
        clicks = np.bincount(a, weights=r, minlength=logged.n_items)
        q[k] = (clicks + prior * mu) / (shown + prior)
    return RewardTable(fold.astype(np.int64), q)


class CandidateSubset:
    """Wraps a policy to choose among `k` items drawn uniformly per row, apart from the log.

    Still a policy over all items (a random slate, then the inner policy's choice), so the
    estimators stay valid for it; it caps what the inner policy can reach, but makes ROFU,
    whose cost grows with the (row, item) pairs it scores, A / k times cheaper.
    `Decision.propensity` is the inner policy's, given the slate.
    """

    def __init__(self, policy: Policy, k: int, *, seed: int = 0) -> None:
        self.policy, self.n_arms = policy, policy.n_arms
        self.k = check_int("k", k, low=1, high=policy.n_arms)
        self.name = f"{policy.name}@{k}"
        self.generator = torch.Generator().manual_seed(check_int("seed", seed, low=0))

    def select(self, contexts: torch.Tensor, candidates: torch.Tensor | None = None) -> Decision:
        """The inner policy's choice among a fresh random slate per row. (B, D) -> Decision."""
        noise = torch.rand(contexts.shape[0], self.n_arms, generator=self.generator)  # (B, A)
        slate = torch.zeros(noise.shape, dtype=torch.bool)
        slate.scatter_(1, noise.topk(self.k, dim=1).indices, True)
        if candidates is not None:
            slate &= candidates
            slate = torch.where(slate.any(dim=1, keepdim=True), slate, candidates)
        return self.policy.select(contexts, slate)

    def update(self, batch: Transitions) -> dict[str, float]:
        """The inner policy learns."""
        return self.policy.update(batch)


#: Neural policies see only matched rows (~N / A, 125 on a 10k-row log of 80 items):
#: refit every 5 of them, 20 Adam steps each, continuing from the current weights.
OPE_SCHEDULE = TrainSchedule(
    every=5, fit=FitConfig(steps=20, batch_size=128, optimizer="adam", lr=1e-2)
)
#: ROFU's cost is per (row, item) pair: M = 3 ascent steps (the paper: 5) on 32-row
#: regulariser minibatches, among `ROFU_SLATE` random items per row.
OPE_ROFU = RofuConfig(steps=3, minibatch_size=32)
ROFU_SLATE = 20
POLICY_NOTES = {
    "Uniform": "a uniform item",
    "EpsilonGreedy": "MLP (32,), epsilon 0.05, OPE_SCHEDULE",
    "LinUCB": "disjoint LinUCB, alpha 1, ridge 1",
    "ROFU": f"MLP (32,), M = 3, minibatch 32, OPE_SCHEDULE, among {ROFU_SLATE} random items",
}


def default_policies(seed: int = 0) -> dict[str, PolicyFactory]:
    """The policies of `POLICY_NOTES`, seeded with `seed` (weights, ties, exploration)."""

    def net(d: int, a: int) -> RewardNetConfig:
        return RewardNetConfig(context_dim=d, n_arms=a, hidden=(32,), seed=seed)

    def rofu(d: int, a: int) -> Policy:
        inner = RofuPolicy(net(d, a), OPE_SCHEDULE, OPE_ROFU, seed=seed)
        return CandidateSubset(inner, min(ROFU_SLATE, a), seed=seed)

    return {
        "Uniform": lambda d, a: Uniform(d, a, seed=seed),
        "EpsilonGreedy": lambda d, a: EpsilonGreedy(net(d, a), OPE_SCHEDULE, seed=seed),
        "LinUCB": lambda d, a: LinUCB(d, a, seed=seed),
        "ROFU": rofu,
    }
