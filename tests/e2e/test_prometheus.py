"""A real Prometheus scraping real rofu processes: every dashboard and alert query works.

The processes, on one SQLite file: the API (`rofu serve`, serving a seeded checkpoint),
the trainer (`rofu trainer`, its metrics on ROFU_TRAINER_METRICS_PORT) and a second API
replica started with a different network shape, which refuses every checkpoint, serves
model 0 and answers /readyz with 503 (a real 5xx, so the error-rate series exist). The
API explores with a floor (ROFU_EXPLORATION_FLOOR) and holds out 30% of its decisions
(ROFU_HOLDOUT_SHARE, policy `holdout`); its decisions are randomised over
every candidate and feed the uniform baseline's IPS counters, and some choose an arm below
the best mean (policy `explore`) while others choose the best (`exploit`). A
Prometheus server of the test's own scrapes them every second under the job names of
deploy/prometheus/prometheus.yml (rofu-api: both replicas; rofu-trainer) and loads
deploy/prometheus/alerts.yml. After traffic (selects, rewards of 1, 0 and -0.5 with
duplicates, a conflict and an unknown event, bad requests, requests that ask not to
explore), two trainer runs and a late reward (for a decision
the trainer consumed), every expression of the Grafana
dashboard and every alert rule is sent to Prometheus's HTTP API: each must parse and
return data; for an alert condition (`x > 0.05`, `absent(x)`) the comparison is removed
and each operand must return data, while the full expression must still parse.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from rofu.service.deciding.holdout import in_holdout
from rofu.service.settings import Settings
from tests.support import (
    ROOT,
    free_port,
    seed_checkpoint,
    service_process,
    stop_process,
    unavailable,
)

DASHBOARD = ROOT / "deploy" / "grafana" / "rofu-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
# Grafana's built-in variables, as a dashboard over the last hour would set them.
GRAFANA_VARIABLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
CONTEXT_DIM = 4
REWARDS = (1.0, 0.0, -0.5)  # reward of decision i of a round: REWARDS[i % 3]
ROUND_REWARDS = 30  # decisions 0-29 of each round's 40 get a reward
HOLDOUT_SHARE = 0.3
DEADLINE_S = 45  # for each wait below; the whole module takes about 30 s


@dataclass(frozen=True)
class Query:
    """An expression to check and where it comes from."""

    source: str
    expr: str


def dashboard_queries() -> list[Query]:
    """Every target expression of the dashboard, Grafana's variables substituted."""
    found: list[Query] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                if target.get("expr"):
                    source = f"panel {panel['title']!r} [{target.get('legendFormat', '')}]"
                    found.append(Query(source, substitute(target["expr"])))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return found


def substitute(expr: str) -> str:
    """Replace `$var` / `${var}` with the values Grafana would send."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in GRAFANA_VARIABLES:
            raise KeyError(f"dashboard variable ${name} has no test value")
        return GRAFANA_VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def alert_queries() -> list[Query]:
    """The `expr` of every alert rule."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [
        Query(f"alert {rule['alert']}", " ".join(rule["expr"].split()))
        for group in groups
        for rule in group["rules"]
    ]


def _top_level(expr: str) -> str:
    """`expr` with everything inside brackets, braces, parentheses and strings blanked."""
    depth, quote, kept = 0, "", []
    for index, char in enumerate(expr):
        outside = False
        if quote:
            quote = "" if char == quote and expr[index - 1] != "\\" else quote
        elif char in "\"'`":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        else:
            outside = depth == 0
        kept.append(char if outside else " ")
    return "".join(kept)


def condition_operands(expr: str) -> list[str]:
    """What an alert condition compares: the left-hand side of each `x > c`, the
    argument of `absent(x)`, each side of `a and on () b`. An expression that is not a
    condition is its own operand."""
    parts, start = [], 0
    for match in re.finditer(r"\b(and|or|unless)\b", _top_level(expr)):
        parts.append(expr[start : match.start()])
        start = match.end()
    parts.append(expr[start:])
    operands = []
    for part in parts:
        part = re.sub(r"^\s*(on|ignoring)\s*\([^)]*\)", "", part).strip()
        absent = re.fullmatch(r"absent\((.*)\)", part, re.DOTALL)
        if absent:
            operands.append(absent.group(1).strip())
            continue
        comparison = re.search(r"(==|!=|>=|<=|>|<)", _top_level(part))
        operands.append(part[: comparison.start()].strip() if comparison else part)
    return operands


class Prometheus:
    """A client for the HTTP API of the test's Prometheus server."""

    def __init__(self, base_url: str) -> None:
        self.client = httpx.Client(base_url=base_url, timeout=30)

    def api(self, path: str, **params: object) -> dict[str, Any]:
        response = self.client.get(f"/api/v1/{path}", params=params)
        body: dict[str, Any] = response.json()
        return body

    def query(self, expr: str) -> dict[str, Any]:
        return self.api("query", query=expr)

    def query_range(self, expr: str, seconds: int = 30) -> dict[str, Any]:
        end = time.time()
        return self.api("query_range", query=expr, start=end - seconds, end=end, step=1)


def _prometheus_config(path: Path, api: list[str], trainer: str) -> None:
    """The compose stack's scrape jobs, pointed at the test's processes, every second."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "rofu-api",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": api}],
            },
            {
                "job_name": "rofu-trainer",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [trainer]}],
            },
        ],
    }
    path.write_text(yaml.safe_dump(config))


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            args, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )


def _wait(what: str, check: Any, processes: list[subprocess.Popen[bytes]]) -> Any:
    """Poll `check()` until it returns something truthy; fail if a process died."""
    deadline = time.monotonic() + DEADLINE_S
    last: Any = None
    while time.monotonic() < deadline:
        for process in processes:
            assert process.poll() is None, f"{process.args} exited with {process.returncode}"
        with contextlib.suppress(httpx.HTTPError):
            last = check()
            if last:
                return last
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {DEADLINE_S}s (last: {last!r})")


@dataclass
class Stack:
    """Everything the tests query, and what the traffic did."""

    prometheus: Prometheus
    statuses: dict[str, list[int]]


def _drive(client: httpx.Client, round_no: int, statuses: dict[str, list[int]]) -> None:
    """Selects (concurrent, so micro-batches form), rewards with duplicates, a conflict,
    an unknown event and bad requests; records every status by kind."""

    def select(i: int) -> int:
        context = [((i * 7 + j) % 11) / 11 - 0.5 for j in range(CONTEXT_DIM)]
        body = {"context": context, "event_id": f"r{round_no}-{i}", "explore": i % 8 != 7}
        return client.post("/v1/select", json=body).status_code

    with ThreadPoolExecutor(8) as pool:
        statuses["select"] += list(pool.map(select, range(40)))
    for i in range(ROUND_REWARDS):
        body = {"event_id": f"r{round_no}-{i}", "value": REWARDS[i % 3]}
        statuses["reward"].append(client.post("/v1/reward", json=body).status_code)
    for i in range(3):
        body = {"event_id": f"r{round_no}-{i}", "value": REWARDS[i % 3]}
        statuses["duplicate"].append(client.post("/v1/reward", json=body).status_code)
    conflict = {"event_id": f"r{round_no}-0", "value": 5.0}
    statuses["conflict"].append(client.post("/v1/reward", json=conflict).status_code)
    unknown = {"event_id": f"never-selected-{round_no}", "value": 1.0}
    statuses["unknown"].append(client.post("/v1/reward", json=unknown).status_code)
    short = {"context": [0.0] * (CONTEXT_DIM - 1)}
    statuses["bad"].append(client.post("/v1/select", json=short).status_code)
    truncated = {"content-type": "application/json"}
    statuses["bad"].append(client.post("/v1/reward", content=b"{", headers=truncated).status_code)
    statuses["bad"].append(client.get("/no-such-page").status_code)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = shutil.which("prometheus")
    if binary is None:
        unavailable("prometheus", FileNotFoundError("no `prometheus` on PATH"))
    assert binary is not None
    root = tmp_path_factory.mktemp("prometheus")
    database = f"sqlite:///{root / 'rofu.sqlite'}"
    settings = Settings(database_url=database, context_dim=CONTEXT_DIM, hidden=(16, 16))
    seed_checkpoint(settings, n_rows=200)
    common = {
        "ROFU_DATABASE_URL": database,
        "ROFU_CONTEXT_DIM": str(CONTEXT_DIM),
        "ROFU_HIDDEN": "[16, 16]",
        "ROFU_EMBEDDED_TRAINER": "false",
        "ROFU_CHECKPOINT_POLL_SECONDS": "1",
        "ROFU_HOST": "127.0.0.1",
        "ROFU_EXPLORATION_FLOOR": "0.3",
        "ROFU_HOLDOUT_SHARE": str(HOLDOUT_SHARE),  # the holdout panel's series
        # a learner family of two candidates of the same network, so the learner panel's
        # series exist and the canary's other network still refuses every checkpoint
        "ROFU_LEARNERS": '["mlp", "sgd-decay"]',
    }
    trainer_port, canary_port, prometheus_port = free_port(), free_port(), free_port()
    trainer_env = {
        **common,
        "ROFU_TRAINER_METRICS_PORT": str(trainer_port),
        "ROFU_REWARD_WINDOW_SECONDS": "1",
        "ROFU_TRAIN_INTERVAL_SECONDS": "1",
        "ROFU_FIT_STEPS": "20",
        "ROFU_DEFAULT_REWARD": "0",  # every closed decision is trained on: each run publishes
    }
    # A replica whose network differs from the checkpoints': it refuses them all.
    canary_env = {**common, "ROFU_HIDDEN": "[8]", "ROFU_PORT": str(canary_port)}
    statuses: dict[str, list[int]] = {
        k: []
        for k in ("select", "reward", "duplicate", "conflict", "unknown", "bad", "canary", "late")
    }
    processes: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as exits:
        base_url = exits.enter_context(service_process(common, root / "api.log"))
        serve = [sys.executable, "-m", "rofu.service.cli", "serve", "--log-level", "warning"]
        trainer = [sys.executable, "-m", "rofu.service.cli", "trainer", "--log-level", "warning"]
        processes.append(_start(serve, canary_env, root / "canary.log"))
        processes.append(_start(trainer, trainer_env, root / "trainer.log"))
        config = root / "prometheus.yml"
        api_targets = [base_url.removeprefix("http://"), f"127.0.0.1:{canary_port}"]
        _prometheus_config(config, api_targets, f"127.0.0.1:{trainer_port}")
        prometheus_args = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={root / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
            "--log.level=warn",
        ]
        processes.append(_start(prometheus_args, {}, root / "prometheus.log"))
        for process in processes:
            exits.callback(stop_process, process)
        try:
            prometheus = Prometheus(f"http://127.0.0.1:{prometheus_port}")
            exits.callback(prometheus.client.close)
            client = exits.enter_context(httpx.Client(base_url=base_url, timeout=30))
            canary = exits.enter_context(
                httpx.Client(base_url=f"http://127.0.0.1:{canary_port}", timeout=30)
            )
            _wait("the canary replica answers", lambda: canary.get("/healthz"), processes)
            # Prometheus scrapes every target once before the traffic: increase() counts
            # only what a counter gains after its first sample, and on an idle machine the
            # traffic used to end before Prometheus's first scrape (every increase 0).
            _wait(
                "every scrape target is up before the traffic",
                lambda: _targets_up(prometheus) == {"rofu-api": 2, "rofu-trainer": 1},
                processes,
            )
            for round_no, version in ((1, 2), (2, 3)):
                _drive(client, round_no, statuses)
                statuses["canary"].append(canary.get("/readyz").status_code)
                time.sleep(1.2)  # the reward window closes; the trainer's next run takes it
                _wait(
                    f"the API serves model {version} from the trainer",
                    lambda v=version: client.get("/v1/model").json()["version"] >= v,
                    processes,
                )
            _post_late_reward(client, f"http://127.0.0.1:{trainer_port}", statuses, processes)
            _wait(
                "every scrape target is up",
                lambda: _targets_up(prometheus) == {"rofu-api": 2, "rofu-trainer": 1},
                processes,
            )
            yield Stack(prometheus, statuses)
        except BaseException:
            for name in ("api", "canary", "trainer", "prometheus"):
                print(f"--- {name}.log\n" + (root / f"{name}.log").read_text()[-3000:])
            raise


def _consumed(trainer_url: str) -> float:
    """Decisions the trainer has consumed so far (its rows counter, every use)."""
    text = httpx.get(f"{trainer_url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("rofu_trainer_rows_total{")
    )


def _post_late_reward(
    client: httpx.Client,
    trainer_url: str,
    statuses: dict[str, list[int]],
    processes: list[subprocess.Popen[bytes]],
) -> None:
    """A reward for a round-1 decision that got none: once the trainer has consumed all 40
    of round 1 (it takes them oldest first), the reward is late."""
    _wait("the trainer consumed round 1", lambda: _consumed(trainer_url) >= 40, processes)
    response = client.post("/v1/reward", json={"event_id": "r1-35", "value": 1.0})
    statuses["late"].append(response.status_code if response.json().get("late") else -1)


def _targets_up(prometheus: Prometheus) -> dict[str, int]:
    targets = prometheus.api("targets")["data"]["activeTargets"]
    up: dict[str, int] = {}
    for target in targets:
        if target["health"] == "up":
            job = target["labels"]["job"]
            up[job] = up.get(job, 0) + 1
    return up


def _describe(result: dict[str, Any]) -> str:
    data = result.get("data", {})
    series = data.get("result", [])
    if data.get("resultType") == "matrix":
        points = sum(len(s["values"]) for s in series)
        return f"{len(series)} series, {points} points"
    values = [s["value"][1] for s in series[:3]]
    return f"{len(series)} series {values}"


def _has_data(result: dict[str, Any]) -> bool:
    return result.get("status") == "success" and bool(result["data"]["result"])


def test_prometheus_traffic_was_as_intended(stack: Stack) -> None:
    s = stack.statuses
    assert set(s["select"]) == {200}
    assert set(s["reward"]) == {200}
    assert set(s["duplicate"]) == {200}
    assert s["conflict"] == [409, 409]
    assert s["unknown"] == [404, 404]
    assert sorted(set(s["bad"])) == [404, 422]
    assert set(s["canary"]) == {503}
    assert s["late"] == [200]  # and the response said `late: true`


def test_prometheus_every_dashboard_query_returns_data(stack: Stack) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 20
    prometheus = stack.prometheus
    # Series created by the last traffic need a second scrape before rate() sees them.
    _wait(
        "every dashboard query returns data",
        lambda: all(_has_data(prometheus.query(q.expr)) for q in queries),
        [],
    )
    failures = []
    print(f"\n{len(queries)} dashboard queries (instant, then 30 s range at 1 s steps):")
    for query in queries:
        instant, ranged = prometheus.query(query.expr), prometheus.query_range(query.expr)
        print(f"  {query.source}: {_describe(instant)}; range {_describe(ranged)}")
        if not (_has_data(instant) and _has_data(ranged)):
            failures.append((query, instant.get("error"), ranged.get("error")))
    assert not failures, failures


def test_prometheus_every_alert_expression_parses_and_its_operands_return_data(
    stack: Stack,
) -> None:
    queries = alert_queries()
    assert len(queries) == 13
    prometheus = stack.prometheus
    failures = []
    print(f"\n{len(queries)} alert expressions (full, then each operand):")
    for query in queries:
        full = prometheus.query(query.expr)
        print(f"  {query.source}: {full['status']}, {_describe(full)}")
        if full.get("status") != "success" or "error" in full:
            failures.append((query, full))
        for operand in condition_operands(query.expr):
            result = _wait(f"{operand} returns data", lambda o=operand: _data(prometheus, o), [])
            print(f"    {operand}: {_describe(result)}")
    assert not failures, failures


def _data(prometheus: Prometheus, expr: str) -> dict[str, Any] | None:
    result = prometheus.query(expr)
    return result if _has_data(result) else None


def test_prometheus_loads_every_alert_rule(stack: Stack) -> None:
    expected = {
        group["name"]: {rule["alert"] for rule in group["rules"]}
        for group in yaml.safe_load(ALERTS.read_text())["groups"]
    }
    groups = stack.prometheus.api("rules")["data"]["groups"]
    loaded = {group["name"]: {rule["name"] for rule in group["rules"]} for group in groups}
    assert loaded == expected
    print("\nalert rules:")
    for group in groups:
        for rule in group["rules"]:
            print(f"  {group['name']}/{rule['name']}: health={rule['health']} {rule['state']}")
            assert rule["health"] in ("ok", "unknown"), rule
            assert not rule.get("lastError"), rule


def test_prometheus_queries_see_what_happened(stack: Stack) -> None:
    """A few values: the queries measure what their panels say."""
    prometheus = stack.prometheus

    def labels(expr: str, label: str) -> set[str]:
        return {s["metric"].get(label, "") for s in prometheus.query(expr)["data"]["result"]}

    def value(expr: str) -> float:
        result = prometheus.query(expr)["data"]["result"]
        return float(result[0]["value"][1]) if result else float("nan")

    expected = {"accepted", "duplicate", "conflict", "unknown_event", "late"}
    by_outcome = 'sum by (outcome) (rofu_rewards_total{job="rofu-api"})'
    _wait("every reward outcome is scraped", lambda: labels(by_outcome, "outcome") == expected, [])
    statuses = labels('sum by (status) (rofu_http_requests_total{job="rofu-api"})', "status")
    assert {"200", "404", "409", "422", "503"} <= statuses
    checks = {
        # the canary replica serves model 0, the API model 3 or newer
        'max(rofu_model_version{job="rofu-api"}) - min(rofu_model_version{job="rofu-api"})': 3,
        'rofu_trainer_checkpoints_published_total{job="rofu-trainer"}': 2,
        'sum(rofu_checkpoint_rejected_total{job="rofu-api"})': 1,
        'sum(rofu_selections_total{job="rofu-api"})': 80,
        'sum(rofu_http_requests_total{job="rofu-api", status="503"})': 2,
    }
    for expr, least in checks.items():
        _wait(f"{expr} >= {least}", lambda e=expr, n=least: value(e) >= n, [])


def test_prometheus_business_metrics_add_up(stack: Stack) -> None:
    """Every stored reward counted once, late included: the counts match the outcomes,
    the sum matches what was posted, and the uniform estimate's rows are the randomised
    ones."""
    prometheus = stack.prometheus

    def value(expr: str) -> float:
        result = prometheus.query(expr)["data"]["result"]
        return float(result[0]["value"][1]) if result else float("nan")

    rounds, late = 2, 1.0
    posted = [REWARDS[i % 3] for i in range(ROUND_REWARDS)] * rounds + [late]
    # explore: false for decisions 7, 15, 23 of each round: argmax, not randomised, unless
    # held out (the holdout's uniform control); and the late one, r1-35
    rewarded = [f"r{n}-{i}" for n in range(1, rounds + 1) for i in range(ROUND_REWARDS)]
    randomised = sum(
        int(e.split("-")[1]) % 8 != 7 or in_holdout(HOLDOUT_SHARE, "holdout", e)
        for e in [*rewarded, "r1-35"]
    )
    api = 'job="rofu-api"'
    expected = {
        f"sum(rofu_rewarded_decisions_total{{{api}}})": len(posted),
        f'sum(rofu_rewards_total{{{api}, outcome=~"accepted|late"}})': len(posted),
        f'sum(rofu_reward_value_total{{{api}, sign="positive"}}) - '
        f'sum(rofu_reward_value_total{{{api}, sign="negative"}})': sum(posted),
        f"sum(rofu_uniform_ips_rows_total{{{api}}})": randomised,
    }
    for expr, number in expected.items():
        _wait(f"{expr} == {number}", lambda e=expr, n=number: abs(value(e) - n) < 1e-9, [])
    policies = 'sum by (policy) (rofu_selections_total{job="rofu-api"})'
    found = {s["metric"]["policy"] for s in prometheus.query(policies)["data"]["result"]}
    assert (
        {"explore", "exploit", "holdout"}
        <= found
        <= {*("explore", "exploit", "cold-start", "apprentice", "holdout")}
    )


def test_prometheus_condition_operands() -> None:
    """The helper that strips alert conditions (no server needed)."""
    assert condition_operands("sum(rate(x[5m])) / clamp_min(y, 1e-9) > 0.05") == [
        "sum(rate(x[5m])) / clamp_min(y, 1e-9)"
    ]
    assert condition_operands('max by (instance) (a{job="j"}) > 3600 and on () b > 0') == [
        'max by (instance) (a{job="j"})',
        "b",
    ]
    assert condition_operands('absent(t{job="x"})') == ['t{job="x"}']
    assert condition_operands('x{status=~"5..", a!="b"} < 0.1') == ['x{status=~"5..", a!="b"}']
    assert condition_operands("count(x) > 1") == ["count(x)"]
    assert substitute("rate(x[$__rate_interval]) ${__range}") == "rate(x[1m]) 1h"
