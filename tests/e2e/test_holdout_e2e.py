"""A 20% holdout on the embedded service, as a real process with its in-process trainer: an
app whose best arm depends on the context, users returning as units; the report finds
rofu's lift over the uniform control with an anytime-valid interval that excludes 0, and
the database shows that no holdout decision was ever trained on."""

from __future__ import annotations

import sqlite3
import time

import httpx
import numpy as np
import torch

from rofu.models.checkpoint import load_checkpoint
from tests.support import service_process

ARMS = ["red", "green", "blue"]
DIM = 4
USERS = [f"user-{i}" for i in range(250)]


def _env(database_url: str) -> dict[str, str]:
    return {
        "ROFU_DATABASE_URL": database_url,
        "ROFU_CONTEXT_DIM": str(DIM),
        "ROFU_ARMS": "[" + ", ".join(f'{{"id": "{a}"}}' for a in ARMS) + "]",
        "ROFU_MAX_ARMS": str(len(ARMS)),
        "ROFU_HIDDEN": "[16]",
        "ROFU_REWARD_WINDOW_SECONDS": "0",
        "ROFU_TRAIN_EVERY_REWARDS": "50",
        "ROFU_TRAIN_INTERVAL_SECONDS": "1",
        "ROFU_FIT_STEPS": "150",
        "ROFU_FIT_LR": "0.01",
        "ROFU_HOLDOUT_SHARE": "0.2",
        "ROFU_HOLDOUT_SALT": "e2e",
    }


def _version(client: httpx.Client) -> int:
    version: int = client.get("/v1/model").json()["version"]
    return version


def test_holdout_report_shows_rofus_lift_and_holdout_rows_are_never_trained_on(tmp_path):
    rng = np.random.default_rng(7)
    weights = rng.normal(size=(len(ARMS), DIM))
    path = tmp_path / "rofu.sqlite"
    rewards: dict[str, float] = {}
    with (
        service_process(_env(f"sqlite:///{path}"), tmp_path / "api.log") as base_url,
        httpx.Client(base_url=base_url, timeout=30) as client,
    ):
        for round_ in range(1_200):
            context = [float(v) for v in rng.normal(size=DIM)]
            body = {"context": context, "unit_id": USERS[int(rng.integers(len(USERS)))]}
            chosen = client.post("/v1/select", json=body)
            assert chosen.status_code == 200, chosen.text
            decision = chosen.json()
            mean = float(weights[ARMS.index(decision["arm"])] @ np.asarray(context))
            value = mean + float(rng.normal(scale=0.1))
            metrics = {"latency_ms": float(rng.normal(100, 5))}
            reward = {"event_id": decision["event_id"], "value": value, "metrics": metrics}
            assert client.post("/v1/reward", json=reward).status_code == 200
            rewards[decision["event_id"]] = value
            if round_ % 200 == 199:  # let the trainer keep up, as in production
                deadline = time.monotonic() + 60
                while _version(client) < 1 and time.monotonic() < deadline:
                    time.sleep(0.2)
        report = client.get("/v1/report").json()
        version = _version(client)
        time.sleep(1.5)  # the last training run may be consuming rows now
    print(report["reward"], report["groups"], report["sample_ratio"], version)
    assert version >= 3
    groups = report["groups"]
    assert groups["rofu"]["decisions"] + groups["holdout"]["decisions"] == 1_200
    assert 25 <= groups["holdout"]["units"] <= 75  # 250 users x 0.2 = 50
    reward = report["reward"]
    assert reward["difference"]["estimate"] > 0
    assert reward["significant"]
    assert reward["sequential"]["low"] > 0  # the anytime-valid interval excludes 0
    assert reward["lift"]["estimate"] is not None
    assert not report["sample_ratio"]["mismatch"]
    latency = report["guardrails"]["latency_ms"]
    assert latency["rofu"]["units"] > 0
    assert latency["holdout"]["units"] > 0
    assert not latency["significant"]  # the same latency in both groups

    with sqlite3.connect(path) as db:
        held = {e for (e,) in db.execute("select event_id from decisions where policy = 'holdout'")}
        groups_of = dict(db.execute("select event_id, experiment from decisions"))
        blobs = [blob for (blob,) in db.execute("select blob from checkpoints")]
    assert held
    assert held == {e for e, g in groups_of.items() if g == "holdout"}
    trained: set[float] = set()  # every reward any checkpoint's sample holds, as float32
    for blob in blobs:
        sample = load_checkpoint(blob).data.sample.rewards
        trained |= set(sample.to(torch.float32).tolist())
    as_stored = {e: float(np.float32(v)) for e, v in rewards.items()}
    kept = {v for e, v in as_stored.items() if e not in held}
    assert len(kept & trained) > 0.5 * len(kept)  # rofu's rows were trained on
    assert not {as_stored[e] for e in held} & trained  # the holdout's never
