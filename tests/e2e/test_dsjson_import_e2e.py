"""From another system's log to a served checkpoint: `rofu import --dsjson`, then
`rofu train --from-log --holdout 0.2`, `rofu evaluate` (rofu's policy and the logged one,
with intervals, on the held-out rows), and a real `rofu serve` on the imported database
serving the checkpoint. Once for a log written by `rofu export` (a round trip into a fresh
database), once for a hand-made Personalizer-style log (named features in namespaces,
`_tag` actions with named features, `_label_*`, `p`, `_skipLearn`, `o[].ActionTaken`)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rofu import cli
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.log.pages import Window, iter_decisions
from rofu.service.settings import get_settings
from tests.simulated_app import ARMS, KnownApp, service_settings
from tests.support import service_process

BASE = {
    "ROFU_HIDDEN": "[]",
    "ROFU_EMBEDDED_TRAINER": "false",
    "ROFU_FIT_STEPS": "100",
    "ROFU_FIT_LR": "0.1",
    "ROFU_FIT_BATCH_SIZE": "100000",
}
Shell = Callable[..., dict[str, str]]


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> Iterator[Shell]:
    """Sets this process's ROFU_* settings (the CLI reads them); returns them."""
    for name in list(os.environ):
        if name.upper().startswith("ROFU_"):
            monkeypatch.delenv(name)

    def use(url: str, **extra: str) -> dict[str, str]:
        env = BASE | {"ROFU_DATABASE_URL": url} | extra
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        return env

    yield use
    get_settings.cache_clear()


def _records(url: str) -> list[Any]:
    engine = make_engine(url)
    try:
        return list(iter_decisions(session_factory(engine), Window()))
    finally:
        engine.dispose()


def _train_and_evaluate(
    out: Path, capsys: pytest.CaptureFixture[str], rows: int, held: int
) -> dict[str, Any]:
    """`rofu train --from-log --holdout 0.2` then `rofu evaluate`: checks that the served
    v1 and the logged policy are estimated, with intervals, on the held-out rows: `held`
    of them, fewer when decisions share the cut-off's timestamp (those are trained on)."""
    assert cli.main(["train", "--from-log", "--holdout", "0.2"]) == 0
    trained = capsys.readouterr().out
    said = re.search(r"rofu train: checkpoint v1; (\d+) rewarded decisions held out", trained)
    assert said is not None, trained
    assert held - 3 <= int(said.group(1)) <= held
    held = int(said.group(1))
    assert cli.main(["evaluate", "--out", str(out)]) == 0
    figures: dict[str, Any] = json.loads((out / "evaluate.json").read_text())
    assert figures["rows"] == rows
    assert figures["served"]["version"] == 1
    assert figures["reference"]["rows"] == held  # the held-out rows, never seen by v1
    served = figures["policies"]["served v1"]
    assert (served["rows"], served["fitted_on"]) == (held, 0)
    for estimate in (served["ips"], served["dr"], figures["logged"]):  # SNIPS: few matches
        assert np.isfinite([estimate["ci_low"], estimate["value"], estimate["ci_high"]]).all()
        assert estimate["ci_low"] <= estimate["value"] <= estimate["ci_high"]
    return figures


@pytest.mark.anyio
async def test_import_round_trips_rofu_export_and_warm_starts_a_served_checkpoint(
    shell: Shell, tmp_path: Path, capsys: pytest.CaptureFixture[str], logs: Any
) -> None:
    source = f"sqlite:///{tmp_path}/source.sqlite"
    await KnownApp(seed=5).serve(service_settings(source), "p", 80)  # cold start: uniform
    log = tmp_path / "log.dsjson"
    shell(source, ROFU_CONTEXT_DIM="4", ROFU_MAX_ARMS="4")
    assert cli.main(["export", "--format", "dsjson", "--out", str(log)]) == 0

    target = f"sqlite:///{tmp_path}/target.sqlite"
    env = shell(target, ROFU_CONTEXT_DIM="4", ROFU_MAX_ARMS="4", ROFU_ARMS="[]")
    assert cli.main(["migrate"]) == 0
    capsys.readouterr()
    assert cli.main(["import", "--dsjson", str(log)]) == 0
    assert f"{log}: imported 80 events (80 with rewards), 4 arms created" in capsys.readouterr().out
    kept = ("event_id", "created_at", "context", "candidates", "arm", "propensity")  # not slots
    kept += ("probabilities", "reward", "explore", "scores", "deferred", "active")
    before, after = _records(source), _records(target)
    assert [r.model_dump(include=set(kept)) for r in after] == [
        r.model_dump(include=set(kept)) for r in before
    ]
    assert {(r.policy, r.model_version) for r in after} == {("imported", 0)}

    figures = _train_and_evaluate(tmp_path / "evaluate", capsys, rows=80, held=16)
    held = figures["reference"]["rows"]
    assert cli.main(["train", "--from-log"]) == 0  # the held-out rows, continuing v1
    assert f"checkpoint v2: trained on {held} of {held} decisions" in capsys.readouterr().out
    with service_process(env, logs("target")) as base_url:
        decided = httpx.post(f"{base_url}/v1/select", json={"context": [0.1] * 4}, timeout=30)
    assert decided.status_code == 200, decided.text
    assert decided.json()["model_version"] == 2
    assert decided.json()["arm"] in ARMS


def _personalizer_log(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` events of an epsilon-greedy Personalizer loop on three dishes; every tenth
    deferred and activated, every fifteenth deferred and never activated, every
    twelfth without a reward."""
    rng = np.random.default_rng(seed)
    dishes = [
        {"_tag": "pasta", "dish": {"cuisine": "italian"}, "price": 12},
        {"_tag": "sushi", "dish": {"cuisine": "japanese"}, "price": 20},
        {"_tag": "salad", "dish": {"cuisine": "any"}},
    ]
    events = []
    for i in range(n):
        country = ["fr", "de", "jp"][i % 3]
        best = {"fr": 0, "de": 2, "jp": 1}[country]
        probabilities = np.full(3, 0.1)
        probabilities[best] = 0.8
        chosen = int(rng.choice(3, p=probabilities))
        order = [chosen] + [j for j in range(3) if j != chosen]
        event: dict[str, Any] = {
            "_label_cost": -float(chosen == best),
            "_label_probability": float(probabilities[chosen]),
            "_label_Action": chosen + 1,
            "_labelIndex": chosen,
            "o": [{"v": float(chosen == best), "EventId": f"pz-{i}", "ActionTaken": i % 10 == 0}],
            "Timestamp": f"2025-01-{1 + i // 100:02d}T{(i // 4) % 24:02d}:{i % 60:02d}:00.0000000Z",
            "Version": "1",
            "EventId": f"pz-{i}",
            "a": [j + 1 for j in order],
            "c": {
                "user": {"country": country, "age": float(20 + i % 40)},
                "device": {"mobile": bool(i % 2)},
                "_multi": dishes,
            },
            "p": [float(probabilities[j]) for j in order],
            "VWState": {"m": "model-1"},
        }
        if i % 15 == 7:
            event["_skipLearn"] = True
        if i % 12 == 5:
            for key in ("_label_cost", "_label_Action", "_labelIndex", "o"):
                del event[key]
        events.append(event)
    return events


def test_import_of_a_personalizer_log_evaluates_and_warm_starts_the_facade(
    shell: Shell, tmp_path: Path, capsys: pytest.CaptureFixture[str], logs: Any
) -> None:
    events = _personalizer_log(150, seed=3)
    log = tmp_path / "personalizer.dsjson"
    log.write_text("".join(json.dumps(event) + "\n" for event in events))
    target = f"sqlite:///{tmp_path}/imported.sqlite"
    env = shell(target, ROFU_CONTEXT_DIM="16", ROFU_MAX_ARMS="8", ROFU_ARMS="[]")
    assert cli.main(["migrate"]) == 0
    capsys.readouterr()
    assert cli.main(["import", "--dsjson", str(log)]) == 0
    rewarded = sum("_label_cost" in event for event in events)
    assert (
        f"imported 150 events ({rewarded} with rewards), 3 arms created" in capsys.readouterr().out
    )
    records = {r.event_id: r for r in _records(target)}
    assert records["pz-0"].deferred
    assert records["pz-0"].active
    assert records["pz-7"].deferred
    assert not records["pz-7"].active
    assert records["pz-5"].reward is None
    active = sum(r.active and r.reward is not None for r in records.values())

    _train_and_evaluate(tmp_path / "evaluate", capsys, rows=active, held=round(0.2 * active))

    first = events[0]["c"]
    rank = {
        "eventId": "after-import-1",
        "contextFeatures": [{"user": first["user"]}, {"device": first["device"]}],
        "actions": [
            {"id": "pasta", "features": [{"dish": {"cuisine": "italian"}, "price": 12}]},
            {"id": "sushi", "features": [{"dish": {"cuisine": "japanese"}}]},
        ],
    }
    with service_process(env, logs("imported")) as base_url:
        ranked = httpx.post(f"{base_url}/personalizer/v1.0/rank", json=rank, timeout=30)
        assert ranked.status_code == 201, ranked.text
        since = {"since": "2026-01-01"}  # after the imported log
        stored = httpx.get(f"{base_url}/v1/decisions", params=since, timeout=30).json()
    served = {row["event_id"]: row for row in stored}["after-import-1"]
    assert served["model_version"] == 1
    assert served["context"] == records["pz-0"].context  # hashed as the facade hashes
