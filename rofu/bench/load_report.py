"""The load benchmark's pure parts: metric parsing, percentiles and the report."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from rofu.bench.load_wrk import WrkSeries

BATCH_METRIC = "rofu_select_batch_size"

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?)\s+(\S+)")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks; NaN when empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def parse_metrics(text: str) -> dict[str, float]:
    """Samples of a Prometheus text exposition, keyed by `name{labels}` as written."""
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match:  # comments (# HELP, # TYPE) never match
            samples[match.group(1)] = float(match.group(2))
    return samples


def histogram_delta(
    before: dict[str, float], after: dict[str, float], name: str
) -> tuple[float, float]:
    """(sum, count) a histogram gained between two scrapes."""

    def gained(part: str) -> float:
        return after.get(f"{name}_{part}", 0.0) - before.get(f"{name}_{part}", 0.0)

    return gained("sum"), gained("count")


SELECT_LATENCY = (
    "rofu_http_request_duration_seconds_bucket"
    '{endpoint="/v1/select",le="%s",method="POST",status="200"}'
)
TARGET_S = 0.25  # the p99 target's bound, and a bucket of the server's latency histogram


def server_count_within(before: dict[str, float], after: dict[str, float], bound: str) -> float:
    """/select answers (200) the server timed within `bound` seconds (a bucket's `le`,
    e.g. "0.25" or "+Inf") between two scrapes: its own clock, from the ASGI call to the
    last byte handed to the server, without the client's or the socket's share."""
    key = SELECT_LATENCY % bound
    return after.get(key, 0.0) - before.get(key, 0.0)


@dataclass
class Level:
    """What one concurrency measured over all its visits (latencies in seconds)."""

    concurrency: int
    seconds: float = 0.0
    select: list[float] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    select_errors: int = 0
    reward_errors: int = 0
    policies: dict[str, int] = field(default_factory=dict)
    batch_sum: float = 0.0
    batch_count: float = 0.0
    acked: dict[str, float] = field(default_factory=dict)  # event_id -> acknowledged reward
    server_selects: float = 0.0  # /select the server timed (one worker only)
    server_within_target: float = 0.0  # of which within TARGET_S
    wrk_select: WrkSeries = field(default_factory=WrkSeries)  # wrk on /select
    wrk_floor: WrkSeries = field(default_factory=WrkSeries)  # wrk on the floor

    @property
    def mean_batch(self) -> float | None:
        """Mean micro-batch size (None when no batch was observed)."""
        return self.batch_sum / self.batch_count if self.batch_count > 0 else None


def level_figures(level: Level, inproc: dict[int, float]) -> dict[str, Any]:
    """One level's figures: /select and the floor from wrk (throughput, latency in ms, the
    share of the floor), the Python client's /select + /reward mix, and ratios to
    in-process ROFU at the level's mean batch."""
    batch = max(1, round(level.mean_batch or 1))
    select, floor = level.wrk_select.figures(), level.wrk_floor.figures()
    per_decision = 1.0 / select["per_s"] if select["per_s"] > 0 else math.nan  # s of wall time
    p50 = select["p50_ms"] / 1e3
    done = len(level.select) - level.select_errors
    client_errors = level.select_errors + level.reward_errors
    return {
        "concurrency": level.concurrency,
        "select_per_s": select["per_s"],  # of /select, from wrk, as the next four
        "p50_ms": select["p50_ms"],
        "p99_ms": select["p99_ms"],
        "shed": select["shed"],  # 503 overloaded: the documented answer of a full queue
        "wrk_requests": select["requests"],
        "floor_per_s": floor["per_s"],
        "floor_p50_ms": floor["p50_ms"],
        "floor_p99_ms": floor["p99_ms"],
        "share_of_floor": select["per_s"] / floor["per_s"] if floor["per_s"] > 0 else math.nan,
        "p99_over_floor_p99": (
            select["p99_ms"] / floor["p99_ms"] if floor["p99_ms"] > 0 else math.nan
        ),
        "errors": int(select["errors"] + floor["errors"]) + client_errors,
        "seconds": level.seconds,  # the Python client's, as every key below to "policies"
        "selects": len(level.select),
        "select_errors": level.select_errors,
        "client_select_per_s": done / level.seconds if level.seconds else math.nan,
        "select_p50_ms": 1e3 * percentile(level.select, 50),
        "select_p99_ms": 1e3 * percentile(level.select, 99),
        "rewards": len(level.reward),
        "reward_errors": level.reward_errors,
        "reward_p50_ms": 1e3 * percentile(level.reward, 50),
        "reward_p99_ms": 1e3 * percentile(level.reward, 99),
        "policies": level.policies,
        "mean_batch": level.mean_batch,
        # The share of /select slower than 250 ms by the server's own clock during the wrk
        # runs (None with several workers).
        "server_over_250ms_share": (
            1.0 - level.server_within_target / level.server_selects
            if level.server_selects
            else None
        ),
        "inproc_batch": batch,
        "http_ms_per_decision": 1e3 * per_decision,
        "inproc_ms_per_decision": 1e3 * inproc[batch] / batch,
        "http_over_inproc": per_decision / (inproc[batch] / batch),
        "p50_over_inproc_b1": p50 / inproc[1],
        "p50_over_inproc_batch": p50 / inproc[batch],
    }


SUMMARY_KEYS = (
    "select_per_s",
    "p50_ms",
    "p99_ms",
    "floor_per_s",
    "floor_p99_ms",
    "share_of_floor",
    "shed",
    "mean_batch",
    "errors",
)


def by_concurrency(levels: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The headline figures of each level, keyed by its concurrency (as a string)."""
    return {str(row["concurrency"]): {key: row[key] for key in SUMMARY_KEYS} for row in levels}


def format_report(result: dict[str, Any]) -> str:
    """A plain-text table of `run` output."""
    work, rows = result["workload"], result["levels"]
    multi = result.get("workers", 1) > 1
    policies: dict[str, int] = {}
    for row in rows:
        for name, count in row["policies"].items():
            policies[name] = policies.get(name, 0) + count
    lines = [
        f"rofu load benchmark: `rofu serve` on loopback, {result['database']}, embedded trainer "
        f"{'on' if result['trainer'] else 'off'}; {result['device']} ({result['machine']}, "
        f"{result['cpus']} CPUs, {result['threads']} torch threads), torch {result['torch']}; "
        f"server: {result.get('workers', 1)} worker process(es), torch threads "
        f"{result.get('torch_threads') or 'default'}",
        f"workload: ROFU {result.get('estimator', 'exact')} estimator, D={work['context_dim']}, "
        f"A={work['n_arms']}, MLP {work['context_dim']}-"
        f"{'-'.join(map(str, work['hidden']))}-{work['n_arms']}, M={work['steps']}, minibatch="
        f"{work['minibatch']}, |D|={result['n_data']} synthetic rows, checkpoint "
        f"v{result['version']} (v{result['final_version']} served at the end)",
        f"per level: {result['rounds']} interleaved visits of {result['seconds']:g} s in all "
        "on each of: wrk on /select, wrk on the floor (/v1/select/validate: same stack, no "
        f"scoring, no database), the Python client (up to {result['requests']} /select, each "
        f"visit after {result['warmup']} warm-up; /reward after "
        f"{result['reward_fraction']:.0%} of decisions)",
        f"decisions by policy (Python client): "
        f"{', '.join(f'{k} {v}' for k, v in sorted(policies.items()))}; errors (every answer "
        f"but a 200 or a 503 overloaded, both generators): {sum(r['errors'] for r in rows)}"
        + ("; mean batch n/a: each worker process has its own metrics" if multi else ""),
        "",
        f"{'conc':>5} {'select/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'503s':>6} | "
        f"{'floor/s':>8} {'p99 ms':>8} | {'of floor':>8} {'p99/floor':>9} | "
        f"{'mean batch':>10} {'server >250ms':>13}",
    ]
    for r in rows:
        batch = "n/a" if r["mean_batch"] is None else f"{r['mean_batch']:.2f}"
        over = r.get("server_over_250ms_share")
        lines.append(
            f"{r['concurrency']:>5} {r['select_per_s']:>9.1f} {r['p50_ms']:>8.2f} "
            f"{r['p99_ms']:>8.2f} {r['shed']:>6.0f} | {r['floor_per_s']:>8.1f} "
            f"{r['floor_p99_ms']:>8.2f} | {100 * r['share_of_floor']:>7.1f}% "
            f"{r['p99_over_floor_p99']:>8.2f}x | {batch:>10} "
            f"{'n/a' if over is None else f'{100 * over:.2f}%':>13}"
        )
    lines.append(
        "wrk: one native thread; latency from send to last byte. server >250ms: the share of "
        "/select the server itself timed over 250 ms during the wrk runs (one worker only)."
    )
    lines += [
        "",
        "Python client (/select + /reward mix; its p99 holds the generator's own waits):",
        f"{'conc':>5} {'selects':>7} {'err':>4} {'select/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
        f" | {'rewards':>7} {'err':>4} {'p50 ms':>8} {'p99 ms':>8}",
    ]
    for r in rows:
        lines.append(
            f"{r['concurrency']:>5} {r['selects']:>7} {r['select_errors']:>4} "
            f"{r['client_select_per_s']:>9.1f} {r['select_p50_ms']:>8.2f} "
            f"{r['select_p99_ms']:>8.2f} | {r['rewards']:>7} {r['reward_errors']:>4} "
            f"{r['reward_p50_ms']:>8.2f} {r['reward_p99_ms']:>8.2f}"
        )
    lines += ["", f"in-process served scoring, same checkpoint, median of {result['repeats']}:"]
    for b, s in result["inproc_seconds"].items():
        lines.append(f"  batch {b:>4}: {1e3 * s:8.2f} ms/batch  {1e3 * s / b:8.3f} ms/decision")
    lines += [
        "",
        f"{'conc':>5} {'batch':>5} {'HTTP ms/dec':>11} {'in-proc ms/dec':>14} "
        f"{'HTTP/in-proc':>12} {'p50/in-proc(b=1)':>16} {'p50/in-proc(batch)':>18}",
    ]
    for r in rows:
        lines.append(
            f"{r['concurrency']:>5} {r['inproc_batch']:>5} {r['http_ms_per_decision']:>11.3f} "
            f"{r['inproc_ms_per_decision']:>14.3f} {r['http_over_inproc']:>11.2f}x "
            f"{r['p50_over_inproc_b1']:>15.2f}x {r['p50_over_inproc_batch']:>17.2f}x"
        )
    lines.append(
        "HTTP ms/dec: wall time per decision, 1 / (wrk's select/s); in-proc ms/dec: one "
        "served scoring call "
        "/ batch, at the level's mean batch size (rounded); p50/in-proc: wrk's /select p50 "
        "over one scoring call of batch 1 or of the mean batch size."
    )
    audit = result.get("reward_audit")
    if audit is not None:
        verdict = (
            "OK"
            if not (audit["missing"] or audit["duplicated"] or audit["wrong_value"])
            else "FAILED"
        )
        lines.append(
            f"reward audit {verdict}: {audit['acknowledged']} rewards acknowledged with a 2xx, "
            f"{audit['stored']} stored; missing {audit['missing']}, stored twice "
            f"{audit['duplicated']}, wrong value {audit['wrong_value']}, stored without a 2xx "
            f"{audit['unacknowledged_stored']}"
        )
    return "\n".join(lines)


def json_safe(value: Any) -> Any:
    """`value` with string keys and None for NaN or infinities (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value
