"""The load benchmark's native load generator: `wrk`, one thread, request bodies from Lua.

A Python client on the same two cores as the server was most of its own p99 (profiled),
so the throughput levels are driven by `wrk` (Debian's package; `scripts/services.sh`
installs it when missing). Its Lua script posts a fresh N(0, I) context of `dim` floats per
request, counts the answers by status in each thread, and prints one JSON line at the end
with the request count, the socket errors and the latency percentiles (microseconds, from
send to last byte, as wrk measures them). The Python client stays for what needs a reply
read: the /reward mix and the audit of every acknowledged reward.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

MARK = "ROFU_WRK "

LUA = r"""
local dim = tonumber(os.getenv("ROFU_WRK_DIM"))
local key = os.getenv("ROFU_WRK_KEY")
local threads = {}
statuses = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(tonumber(os.getenv("ROFU_WRK_SEED")) + #threads)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  if key ~= nil and key ~= "" then wrk.headers["Authorization"] = "Bearer " .. key end
end

local function gauss()
  local u = math.random()
  while u == 0 do u = math.random() end
  return math.sqrt(-2 * math.log(u)) * math.cos(2 * math.pi * math.random())
end

function request()
  local parts = {}
  for i = 1, dim do parts[i] = string.format("%.5f", gauss()) end
  return wrk.format(nil, nil, nil, '{"context":[' .. table.concat(parts, ",") .. ']}')
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local counts = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do
      counts[status] = (counts[status] or 0) + n
    end
  end
  local parts = {}
  for status, n in pairs(counts) do
    table.insert(parts, string.format('"%d": %d', status, n))
  end
  local e = summary.errors
  io.write(string.format(
    'ROFU_WRK {"requests": %d, "duration_us": %d, "connect_errors": %d, "read_errors": %d, '
      .. '"write_errors": %d, "timeouts": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, '
      .. '"max_us": %d, "statuses": {%s}}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    table.concat(parts, ", ")))
end
"""


class WrkError(RuntimeError):
    """wrk is missing, failed, or printed no result."""


@dataclass(frozen=True)
class WrkRun:
    """One wrk run against one endpoint (latencies in seconds)."""

    requests: int
    seconds: float
    statuses: dict[int, int]
    socket_errors: int
    p50: float
    p90: float
    p99: float

    @property
    def ok(self) -> int:
        """Answers with a 200."""
        return self.statuses.get(200, 0)

    @property
    def shed(self) -> int:
        """503s: the documented answer of a full queue (`ROFU_SELECT_QUEUE_MAX`)."""
        return self.statuses.get(503, 0)

    @property
    def errors(self) -> int:
        """Every other answer or socket error."""
        return self.requests - self.ok - self.shed + self.socket_errors

    @property
    def per_s(self) -> float:
        """200s per second."""
        return self.ok / self.seconds if self.seconds > 0 else math.nan

    @classmethod
    def parse(cls, output: str) -> WrkRun:
        """The run of the script's `ROFU_WRK {...}` line in wrk's output."""
        lines = [line for line in output.splitlines() if line.startswith(MARK)]
        if not lines:
            raise WrkError(f"wrk printed no result; its output:\n{output[-2000:]}")
        raw = json.loads(lines[-1][len(MARK) :])
        errors = sum(raw[k] for k in ("connect_errors", "read_errors", "write_errors", "timeouts"))
        return cls(
            requests=int(raw["requests"]),
            seconds=raw["duration_us"] / 1e6,
            statuses={int(code): int(n) for code, n in raw["statuses"].items()},
            socket_errors=int(errors),
            p50=raw["p50_us"] / 1e6,
            p90=raw["p90_us"] / 1e6,
            p99=raw["p99_us"] / 1e6,
        )


@dataclass
class WrkSeries:
    """Every visit of one endpoint at one concurrency."""

    runs: list[WrkRun] = field(default_factory=list)

    def figures(self) -> dict[str, float]:
        """200s per second over all visits; p50 and p99 (ms) the median of the visits'."""
        seconds = sum(run.seconds for run in self.runs)
        ok = sum(run.ok for run in self.runs)
        return {
            "per_s": ok / seconds if seconds > 0 else math.nan,
            "p50_ms": 1e3 * statistics.median(run.p50 for run in self.runs)
            if self.runs
            else math.nan,
            "p99_ms": 1e3 * statistics.median(run.p99 for run in self.runs)
            if self.runs
            else math.nan,
            "requests": float(sum(run.requests for run in self.runs)),
            "shed": float(sum(run.shed for run in self.runs)),
            "errors": float(sum(run.errors for run in self.runs)),
        }


def _median_ms(seconds: list[float]) -> float:
    return 1e3 * statistics.median(seconds) if seconds else math.nan


def wrk_binary() -> str:
    """The path of `wrk`.

    Raises:
        WrkError: not installed, with how to install it.
    """
    found = shutil.which("wrk")
    if found is None:
        raise WrkError(
            "wrk is not installed: `apt-get install wrk` (or `bash scripts/services.sh`, "
            "which installs it)"
        )
    return found


def run_wrk(
    url: str, concurrency: int, seconds: float, dim: int, seed: int, api_key: str | None = None
) -> WrkRun:
    """Drive `url` with `concurrency` keep-alive connections from one wrk thread for
    `seconds` (whole seconds, at least 1), each request a fresh N(0, I) context.

    Raises:
        WrkError: wrk is missing, exits non-zero or prints no result.
    """
    duration = max(1, math.ceil(seconds))
    with tempfile.TemporaryDirectory(prefix="rofu-wrk-") as workdir:
        script = Path(workdir) / "select.lua"
        script.write_text(LUA, encoding="utf-8")
        command = [wrk_binary(), "-t1", f"-c{concurrency}", f"-d{duration}s", "--timeout", "60s"]
        command += ["-s", str(script), url]
        env = os.environ | {"ROFU_WRK_DIM": str(dim), "ROFU_WRK_SEED": str(seed)}
        env["ROFU_WRK_KEY"] = api_key or ""
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=duration + 120, check=False
        )
    if done.returncode != 0:
        raise WrkError(f"wrk exited {done.returncode}: {(done.stderr or done.stdout)[-2000:]}")
    return WrkRun.parse(done.stdout)
