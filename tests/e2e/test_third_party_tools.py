"""Third-party tools on rofu's own decision log: Vowpal Wabbit learns from the DSJSON
export, and Open Bandit Pipeline's IPW and DR on the OBP export agree with `rofu evaluate`.

The service (in-process, through its /v1 API) logs a contextual bandit with a clear best
arm: first uniformly (no model yet); the trainer fits checkpoint 1 on those rows, it is
pinned (PUT /v1/admin/pin) and the trainer runs no more; then the pinned model decides the
compared rows under an exploration floor of 0.2, so every candidate keeps a logged
probability of at least 0.05. T is a moment after the pin: `--since T` selects exactly the
compared rows, which checkpoint 1 did not train on.

- Vowpal Wabbit (the `vowpalwabbit` package, rofu's `vw` extra) reads the whole
  `rofu export --format dsjson` with its own `--dsjson` text reader (`-d`): it counts every
  event, and its greedy choice afterwards is the best arm on most fresh contexts.
- Open Bandit Pipeline reads `rofu export --format obp --since T` as its bandit feedback.
  `obp.ope.OffPolicyEvaluation` with `InverseProbabilityWeighting`,
  `SelfNormalizedInverseProbabilityWeighting` and `DoublyRobust` (obp/ope/estimators.py,
  their `estimate_policy_value` and `estimate_interval`) estimates `uniform` and the
  served model from the exported arrays alone (the served model logged these rows, so
  its action_dist is the exported `pi_b`; uniform spreads over each row's candidates)
  with rofu's DR reward model as `estimated_rewards_by_reg_model` (the cross-fitted ridge
  `rofu.evaluation.evaluate.ridge_rewards`, on the rows `rofu evaluate --since T` reads).
  Its values equal `rofu evaluate`'s IPS, SNIPS and DR to 1e-6, and its bootstrap
  intervals match rofu's normal ones to a tenth of their width.

OBP here is obp itself, not a copy of its formulas: its latest release, 0.5.7, says
Python < 3.11 and pins numpy 1.23, pandas 1.5, scikit-learn 1.1 and torch 1.12, yet imports
and runs on Python 3.11 with current ones, so scripts/setup.sh installs it with `--no-deps
--ignore-requires-python` beside the packages it imports (scikit-learn, seaborn, PyYAML).
Under scripts/test.sh (ROFU_REQUIRE_SERVICES=1) a missing obp or vowpalwabbit fails the
test instead of skipping it.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pytest

from rofu import cli
from rofu.client.records import DecisionRecord
from rofu.evaluation.evaluate import ridge_rewards
from rofu.service import migrate
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.log.pages import EVERYTHING, Window, iter_decisions
from rofu.service.log.service_log import ServiceLog, read_service_log
from rofu.service.settings import Settings, get_settings
from tests.support import app_client, require_module

ARMS = [f"arm-{i}" for i in range(4)]
BEST = ARMS.index("arm-2")
SUBSET = ["arm-3", "arm-1", "arm-0"]  # every third request offers only these, in this order
DIM = 4
TRAINING_ROWS = 240  # uniform, before any model; checkpoint 1 is fitted on them
COMPARED_ROWS = 300  # decided by the pinned checkpoint 1, every tenth left without a reward
UNREWARDED_EVERY = 10
FLOOR = 0.2
NOISE = 0.3
VW_INSTALL = "rofu's vw extra, installed by scripts/setup.sh"
OBP_INSTALL = "scripts/setup.sh installs it: pip install --no-deps --ignore-requires-python obp"
#: What VW's DSJSON reader reads of a cb_adf event (VW's json_parser: the decision-service
#: fields), and of a rewarded one.
DSJSON_EVENT = {"EventId", "Timestamp", "Version", "a", "c", "p", "VWState"}
DSJSON_LABEL = {"_label_cost", "_label_probability", "_label_Action", "_labelIndex", "o"}


class ClearBest:
    """Rewards b_a + w_a . x + N(0, NOISE^2) with x ~ N(0, I_4): arm-2's b leads by 0.5 and
    the slopes are small, so arm-2 is the best arm for most contexts."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.bias = np.array([0.0, 0.3, 1.0, 0.5])  # (A,)
        self.weights = self.rng.normal(scale=0.1, size=(len(ARMS), DIM))  # (A, D)

    def means(self, x: np.ndarray) -> np.ndarray:
        """(N, D) -> (N, A) expected rewards."""
        return x @ self.weights.T + self.bias

    def contexts(self, n: int) -> np.ndarray:
        """(n, D) fresh contexts, rounded as a client would send them."""
        return self.rng.normal(size=(n, DIM)).round(6)


@dataclass(frozen=True)
class Log:
    """The logged service: its settings (also in ROFU_* for the CLI), the bandit, and T."""

    settings: Settings
    bandit: ClearBest
    since: datetime


async def _decide(
    client: httpx.AsyncClient, bandit: ClearBest, prefix: str, count: int, unrewarded: int = 0
) -> None:
    """`count` decisions, 30 at a time (they share micro-batches), each rewarded by the
    bandit except every `unrewarded`-th (0: none)."""
    contexts, noise = bandit.contexts(count), bandit.rng.normal(size=count)

    async def one(i: int) -> None:
        body: dict[str, Any] = {"context": contexts[i].tolist(), "event_id": f"{prefix}-{i:04d}"}
        if i % 3 == 2:
            body["arms"] = SUBSET
        decision = await client.post("/v1/select", json=body)
        assert decision.status_code == 200, decision.text
        if unrewarded and i % unrewarded == unrewarded - 1:
            return
        arm = ARMS.index(decision.json()["arm"])
        value = float(bandit.means(contexts[i : i + 1])[0, arm] + NOISE * noise[i])
        reward = await client.post(
            "/v1/reward", json={"event_id": body["event_id"], "value": value}
        )
        assert reward.status_code == 200, reward.text

    for start in range(0, count, 30):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 30, count))))


async def _serve(settings: Settings, bandit: ClearBest) -> datetime:
    """Log the training rows, fit and pin checkpoint 1, log the compared rows; returns T."""
    async with app_client(settings) as (client, app):
        await _decide(client, bandit, "train", TRAINING_ROWS)
        runtime = app.state.runtime
        trainer = Trainer(settings, runtime.sessions, runtime.store, runtime.local_bus)
        report = await anyio.to_thread.run_sync(trainer.run_once)
        assert report is not None
        assert (report.version, report.rewarded) == (1, TRAINING_ROWS)
        pinned = await client.put("/v1/admin/pin", json={"version": 1})
        assert pinned.json() == {"pinned": 1, "serving": 1}, pinned.text
        since = datetime.now(UTC)  # no trainer runs from here on: nothing consumes what follows
        await _decide(client, bandit, "compared", COMPARED_ROWS, UNREWARDED_EVERY)
    return since


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Log]:
    """The logged service, its ROFU_* settings in the environment for `rofu export` and
    `rofu evaluate` (run in-process through `rofu.cli.main`, as the command runs them)."""
    folder = tmp_path_factory.mktemp("third-party-tools")
    env = {
        "ROFU_DATABASE_URL": f"sqlite:///{folder}/rofu.sqlite",
        "ROFU_CONTEXT_DIM": str(DIM),
        "ROFU_ARMS": json.dumps([{"id": arm} for arm in ARMS]),
        "ROFU_HIDDEN": "[16]",
        "ROFU_EMBEDDED_TRAINER": "false",
        "ROFU_REWARD_WINDOW_SECONDS": "0",
        "ROFU_FIT_STEPS": "200",
        "ROFU_EXPLORATION_FLOOR": str(FLOOR),
    }
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if name.upper().startswith("ROFU_")]:
            patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, value)
        get_settings.cache_clear()
        settings = get_settings()
        migrate.upgrade(settings.database_url)
        bandit = ClearBest(seed=11)
        since = asyncio.run(_serve(settings, bandit))
        yield Log(settings, bandit, since)
    get_settings.cache_clear()


def _records(settings: Settings, window: Window = EVERYTHING) -> list[DecisionRecord]:
    engine = make_engine(settings.database_url)
    try:
        return list(iter_decisions(session_factory(engine), window))
    finally:
        engine.dispose()


def _service_log(settings: Settings, window: Window) -> ServiceLog:
    """The rewarded decisions `rofu evaluate` reads in `window`."""
    engine = make_engine(settings.database_url)
    try:
        return read_service_log(session_factory(engine), window, settings.default_reward)
    finally:
        engine.dispose()


def test_log_has_the_compared_rows_after_t_decided_by_the_pinned_model(log: Log) -> None:
    records = _records(log.settings)
    before = [r for r in records if r.created_at < log.since]
    after = _records(log.settings, Window(log.since))
    assert [r.event_id for r in before] == sorted(f"train-{i:04d}" for i in range(TRAINING_ROWS))
    assert {(r.model_version, r.policy) for r in before} == {(0, "cold-start")}
    assert len(after) == COMPARED_ROWS
    assert {(r.model_version, r.policy) for r in after} == {(1, "rofu")}
    for record in after:  # the floor: support for every candidate
        assert record.probabilities is not None
        assert min(record.probabilities) >= FLOOR / len(record.candidates) - 1e-9
    chosen = [r.arm for r in after]
    assert chosen.count(ARMS[BEST]) > len(after) / 3  # checkpoint 1 learnt to favour it


def _check_event(line: str, record: DecisionRecord) -> dict[str, Any]:
    """One DSJSON line against its record: the fields VW's --dsjson reader needs."""
    event = json.loads(line)
    assert set(event) >= DSJSON_EVENT, sorted(DSJSON_EVENT - set(event))
    assert event["EventId"] == record.event_id
    assert datetime.fromisoformat(event["Timestamp"]) == record.created_at
    k = len(record.candidates)
    assert sorted(event["a"]) == list(range(1, k + 1))
    assert event["a"][0] == record.chosen_index + 1  # the chosen action first
    assert [m["arm"]["id"] for m in event["c"]["_multi"]] == record.candidates
    assert event["c"]["x"] == {str(i): v for i, v in enumerate(record.context)}
    assert event["p"][0] == pytest.approx(record.propensity)
    assert sum(event["p"]) == pytest.approx(1.0)
    if record.reward is None:
        assert not DSJSON_LABEL & set(event), "an unrewarded event has no label"
        return event
    assert event["_label_cost"] == -record.reward
    assert event["_label_probability"] == record.propensity
    assert (event["_label_Action"], event["_labelIndex"]) == (event["a"][0], event["a"][0] - 1)
    assert event["o"][0]["v"] == record.reward
    return event


def _greedy(workspace: Any, template: dict[str, Any], contexts: np.ndarray) -> np.ndarray:
    """VW's greedy choice (argmax of its PMF) over all arms for each (N, D) context, asked
    with events shaped as the export writes them, without a label."""
    picks = []
    for x in contexts:
        event = {key: template[key] for key in DSJSON_EVENT - {"c"}}
        event["c"] = {**template["c"], "x": {str(i): float(v) for i, v in enumerate(x)}}
        examples = workspace.parse(json.dumps(event))
        pmf = workspace.predict(examples)  # per action, in `_multi` order
        workspace.finish_example(examples)
        picks.append(int(np.argmax(pmf)))
    return np.array(picks)


def test_vowpal_wabbit_reads_every_exported_event_and_learns_the_best_arm(
    log: Log, tmp_path: Path
) -> None:
    vw = require_module("vowpalwabbit", VW_INSTALL)
    path, metrics = tmp_path / "log.dsjson", tmp_path / "vw-metrics.json"
    assert cli.main(["export", "--format", "dsjson", "--out", str(path)]) == 0
    lines, records = path.read_text().splitlines(), _records(log.settings)
    assert len(lines) == len(records) == TRAINING_ROWS + COMPARED_ROWS
    events = [_check_event(line, record) for line, record in zip(lines, records, strict=True)]
    rewards = [r.reward for r in records if r.reward is not None]
    assert len(rewards) == TRAINING_ROWS + COMPARED_ROWS - COMPARED_ROWS // UNREWARDED_EVERY
    full = next(e for e in events if len(e["a"]) == len(ARMS))  # VW's PMF is in ARMS order
    assert [m["arm"]["id"] for m in full["c"]["_multi"]] == ARMS

    workspace = vw.Workspace(
        f"--cb_explore_adf --dsjson -q xa --quiet -d {path} --extra_metrics {metrics}"
    )
    try:
        workspace.run_parser()  # VW's own reader and learning loop over the file
        read = workspace.get_learner_metrics()
        assert workspace.get_weighted_examples() == len(lines)
        assert (read["line_parse_error"], read["number_skipped_events"]) == (0, 0)
        assert read["cb_explore_adf_greedy"]["cbea_labeled_ex"] == len(rewards)
        assert read["dsjson_sum_cost_original"] == pytest.approx(-sum(rewards), rel=1e-5)
        assert (read["first_event_id"], read["last_event_id"]) == (
            records[0].event_id,
            records[-1].event_id,
        )
        assert math.isfinite(workspace.get_sum_loss() / workspace.get_weighted_examples())
        contexts = log.bandit.contexts(200)
        picks = _greedy(workspace, full, contexts)
    finally:
        workspace.finish()
    best = log.bandit.means(contexts).argmax(axis=1)  # (N,)
    assert (picks == BEST).mean() >= 0.8, np.bincount(picks, minlength=len(ARMS))
    assert (picks == best).mean() >= 0.8  # it learnt the arm, not just one action index


def _obp_estimates(
    feedback: dict[str, np.ndarray], action_dist: np.ndarray, q: np.ndarray
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """OBP's IPW, SNIPW and DR values and 95% bootstrap intervals of one target policy."""
    from obp.ope import (
        DoublyRobust,
        InverseProbabilityWeighting,
        OffPolicyEvaluation,
        SelfNormalizedInverseProbabilityWeighting,
    )

    estimators = [
        InverseProbabilityWeighting(),
        SelfNormalizedInverseProbabilityWeighting(),
        DoublyRobust(),
    ]
    ope = OffPolicyEvaluation(bandit_feedback=feedback, ope_estimators=estimators)
    values = ope.estimate_policy_values(action_dist, estimated_rewards_by_reg_model=q)
    intervals = ope.estimate_intervals(
        action_dist, estimated_rewards_by_reg_model=q, n_bootstrap_samples=2000, random_state=0
    )
    return {name: float(v) for name, v in values.items()}, intervals


def test_obp_ipw_and_dr_on_the_obp_export_agree_with_rofu_evaluate(
    log: Log, tmp_path: Path
) -> None:
    require_module("obp", OBP_INSTALL)
    since = log.since.isoformat()
    archive, out = tmp_path / "log.npz", tmp_path / "evaluate"
    assert cli.main(["export", "--format", "obp", "--since", since, "--out", str(archive)]) == 0
    assert cli.main(["evaluate", "--since", since, "--out", str(out)]) == 0
    figures = json.loads((out / "evaluate.json").read_text())
    with np.load(archive) as arrays:
        feedback = dict(arrays)

    rows = _service_log(log.settings, Window(log.since))  # what `rofu evaluate` read
    n = COMPARED_ROWS - COMPARED_ROWS // UNREWARDED_EVERY
    assert int(feedback["n_rounds"]) == figures["rows"] == len(rows) == n
    np.testing.assert_array_equal(feedback["action"], rows.actions)
    np.testing.assert_array_equal(feedback["reward"], rows.rewards)
    np.testing.assert_array_equal(feedback["pscore"], rows.propensities)
    np.testing.assert_array_equal(feedback["context"], rows.contexts)
    pi_b = feedback["pi_b"]  # (n, A, 1): checkpoint 1's probabilities, which it logged by
    offered = pi_b > 0  # the floor gives every candidate a positive probability
    np.testing.assert_array_equal(offered[:, :, 0], rows.candidates)
    targets = {"uniform": offered / offered.sum(axis=1, keepdims=True), "served v1": pi_b}
    q = ridge_rewards(rows, seed=figures["seed"])[:, :, None]  # rofu's DR reward model

    pairs = {"ipw": "ips", "snipw": "snips", "dr": "dr"}
    for name, action_dist in targets.items():
        values, intervals = _obp_estimates(feedback, action_dist, q)
        rofu = figures["policies"][name]
        for ours, theirs in pairs.items():
            estimate = rofu[theirs]
            assert values[ours] == pytest.approx(estimate["value"], rel=1e-6), (name, ours)
            interval = intervals[ours]
            width = estimate["ci_high"] - estimate["ci_low"]
            low, high = interval["95.0% CI (lower)"], interval["95.0% CI (upper)"]
            assert abs(low - estimate["ci_low"]) < width / 10, (name, ours, interval, estimate)
            assert abs(high - estimate["ci_high"]) < width / 10, (name, ours, interval, estimate)
    served = figures["policies"]["served v1"]
    assert served["ips"]["value"] == pytest.approx(rows.rewards.mean(), rel=1e-9)  # on-policy
    assert served["dr"]["value"] > figures["policies"]["uniform"]["dr"]["value"]
