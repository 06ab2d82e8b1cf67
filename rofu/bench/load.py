"""Load benchmark: the real service over loopback HTTP, beside in-process batched ROFU.

A checkpoint of the reference workload (context dim 64, 10 arms, MLP 64-100-100-10, M = 5,
regulariser minibatch 256, |D| = 20 000 synthetic rows, all of them the regulariser's
sample, the network fitted on them) is stored in a fresh SQLite database (or the
Postgres of `--database-url`) before `rofu serve` starts on it as a separate process,
embedded trainer off unless `--trainer`; other `ROFU_*` variables of the environment pass
through (e.g. ROFU_BATCH_MAX_WAIT_MS). Each concurrency `c` is visited `--rounds` times,
interleaved round robin with the other levels, each visit a share of `--seconds`:

1. `wrk` (`rofu.bench.load_wrk`, native, one thread, `c` connections) posts /select, a
   fresh N(0, I) context each, then as long the floor `/v1/select/validate` (the same
   server's middleware and JSON stack, no scoring, no database). These give the level's
   throughput and latency, and /select's share of the floor; the mean micro-batch size is
   the difference of the `rofu_select_batch_size` histogram on GET /metrics around the
   /select run.
2. The Python client: `c` simulated apps, each with its own connection, post /select and,
   after `--reward-fraction` of the decisions, /reward (up to `--requests` /select per
   level), after a warm-up; every acknowledged reward is audited at the end.

Then `rofu_scores` is timed in-process on the same checkpoint at batch 1 and at every
observed mean batch size (interleaved, medians). Client and server share the machine's
cores. `wrk` must be installed (`apt-get install wrk`; `scripts/services.sh` installs it).

    python -m rofu.bench.load [--concurrency 1,8,64] [--requests 2000] [--seconds 25]
        [--reward-fraction 0.5] [--database-url postgresql://...] [--json out.json]
        [--torch-threads N] [--workers N]

`--torch-threads` sets ROFU_TORCH_THREADS for the server (and the in-process timing);
`--workers` runs `rofu serve --workers N` (N processes, each micro-batching its own
requests; the mean batch is then not measured, as each process has its own metrics).
`--json` writes every figure, with `by_concurrency` giving per level `select_per_s`,
`p50_ms`, `p99_ms` (of /select, from wrk), `floor_per_s`, `floor_p99_ms`,
`share_of_floor`, `shed` (503s), `mean_batch` and `errors` (every answer but a 200 or a
documented 503, and socket errors, of both generators).

Sustained mode (production readiness): `--trainer --seconds 300 --requests 100000000
--concurrency 16 --rounds 1 --reward-fraction 1` keeps /select + /reward traffic up for
five minutes while the embedded trainer publishes checkpoints. At the end every reward
acknowledged with a 2xx is checked in the database: stored exactly once, with the
acknowledged value (the command exits 1 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import torch

from rofu.bench.load_drive import drive
from rofu.bench.load_inprocess import audit_rewards, inprocess_seconds, seed_checkpoint
from rofu.bench.load_report import by_concurrency, format_report, json_safe, level_figures
from rofu.bench.load_wrk import WrkError, wrk_binary
from rofu.bench.workload import Workload
from rofu.models.presets import PRODUCT
from rofu.models.rofu_config import ESTIMATORS
from rofu.service.runtime import resolve_device
from rofu.service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def concurrency_levels(text: str) -> tuple[int, ...]:
    """Parse `1,8,64` into distinct positive concurrencies, in the given order."""
    try:
        levels = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ints: {text!r}") from None
    if min(levels) < 1 or len(set(levels)) != len(levels):
        raise argparse.ArgumentTypeError(f"concurrencies must be distinct and >= 1: {text!r}")
    return levels


def build_parser() -> argparse.ArgumentParser:
    """The parser of `rofu bench load`."""
    work = Workload()
    parser = argparse.ArgumentParser(prog="rofu bench load", description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--concurrency", type=concurrency_levels, default=(1, 8, 64), help="e.g. 1,8,64")
    add("--requests", type=int, default=2000, help="/v1/select cap per level (default 2000)")
    add("--seconds", type=float, default=25.0, help="time cap per level (default 25)")
    add("--rounds", type=int, default=3, help="interleaved visits per level (default 3)")
    add("--warmup", type=int, default=20, help="unrecorded /select per visit (default 20)")
    add("--reward-fraction", type=float, default=0.5, help="decisions rewarded (default 0.5)")
    add("--n-data", type=int, default=work.n_data, help=f"|D| (default {work.n_data})")
    add("--repeats", type=int, default=7, help="in-process repetitions (default 7)")
    add("--database-url", help="a Postgres database to use instead of a fresh SQLite file")
    add("--trainer", action="store_true", help="keep the embedded trainer on (window 0 s)")
    add("--seed", type=int, default=0, help="the clients' contexts and rewards (default 0)")
    add("--json", dest="json_path", help="also write the figures as JSON here")
    add("--torch-threads", type=int, help="ROFU_TORCH_THREADS of the server (default: torch's)")
    add("--workers", type=int, default=1, help="`rofu serve --workers` (default 1)")
    add(
        "--estimator",
        choices=ESTIMATORS,
        default=PRODUCT.rofu.estimator,
        help=f"ROFU_ESTIMATOR of the server (default {PRODUCT.rofu.estimator}, the product's)",
    )
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse and validate the command line."""
    work = Workload()
    parser = build_parser()
    args = parser.parse_args(argv)
    checks = {
        "--requests must be >= --rounds": args.requests < max(args.rounds, 1),
        "--seconds must be > 0": not args.seconds > 0,
        "--rounds must be >= 1": args.rounds < 1,
        "--warmup must be >= 0": args.warmup < 0,
        "--reward-fraction must be in [0, 1]": not 0 <= args.reward_fraction <= 1,
        f"--n-data must be >= the ROFU minibatch, {work.minibatch}": args.n_data < work.minibatch,
        "--repeats must be >= 1": args.repeats < 1,
        "--database-url must be a postgresql:// URL": not (
            args.database_url is None or args.database_url.startswith("postgresql")
        ),
        "--torch-threads must be >= 1": args.torch_threads is not None and args.torch_threads < 1,
        "--workers must be >= 1": args.workers < 1,
        "--trainer runs in the server process: use --workers 1": args.trainer and args.workers > 1,
    }
    for message, failed in checks.items():
        if failed:
            parser.error(message)
    return args


# The served checkpoint and the server process -------------------------------------------


def server_overrides(args: argparse.Namespace, database_url: str) -> dict[str, Any]:
    """Settings of the served workload (also the ROFU_* variables of the server)."""
    work = Workload()
    overrides: dict[str, Any] = {
        "mode": "embedded",
        "database_url": database_url,
        "context_dim": work.context_dim,
        "arms": [{"id": f"arm-{i}"} for i in range(work.n_arms)],
        "max_arms": work.n_arms,
        "arm_feature_dim": 0,
        "hidden": list(work.hidden),
        "steps": work.steps,
        "minibatch_size": work.minibatch,
        "data_sample_size": max(args.n_data, 20_000),
        "embedded_trainer": args.trainer,
        "estimator": args.estimator,
    }
    if args.trainer:  # decisions close at once, so the trainer really runs under load
        overrides["reward_window_seconds"] = 0
    if args.torch_threads is not None:
        overrides["torch_threads"] = args.torch_threads
    return overrides


def as_environment(overrides: dict[str, object]) -> dict[str, str]:
    """ROFU_* variables (JSON for lists, numbers and booleans)."""
    return {
        f"ROFU_{key.upper()}": value if isinstance(value, str) else json.dumps(value)
        for key, value in overrides.items()
    }


@contextlib.contextmanager
def serve(
    env: dict[str, str], log_path: Path, timeout: float = 120, workers: int = 1
) -> Iterator[str]:
    """`rofu serve` as a real process on loopback, once /readyz says ready; its base URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    full_env = {**os.environ, **env, "ROFU_HOST": "127.0.0.1", "ROFU_PORT": str(port)}
    command = [sys.executable, "-m", "rofu.service.cli", "serve", "--log-level", "warning"]
    command += ["--workers", str(workers)]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while not _ready(base_url):
            if process.poll() is not None or time.monotonic() > deadline:
                log_tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the service did not become ready; its log:\n{log_tail}")
            time.sleep(0.2)
        yield base_url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _ready(base_url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200
    return False


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Store the checkpoint, serve it, drive every level, time ROFU in-process."""
    database_url = args.database_url or f"sqlite:///{workdir}/load.sqlite"
    overrides = server_overrides(args, database_url)
    settings = Settings(**overrides)
    if args.torch_threads is not None:  # the in-process timing runs as the server does
        torch.set_num_threads(args.torch_threads)
    version, blob = seed_checkpoint(settings, args.n_data, args.seed)
    env, log_path = as_environment(overrides), workdir / "service.log"
    with serve(env, log_path, workers=args.workers) as base_url:
        model = httpx.get(f"{base_url}/v1/model", timeout=10).json()
        if model.get("version") != version or model.get("n_data") != args.n_data:
            raise RuntimeError(f"the service serves {model}, not checkpoint v{version}")
        levels = asyncio.run(drive(base_url, args))
        final_version = httpx.get(f"{base_url}/v1/model", timeout=10).json().get("version")
    audit = audit_rewards(database_url, {e: v for lv in levels for e, v in lv.acked.items()})
    batches = sorted({1} | {max(1, round(level.mean_batch or 1)) for level in levels})
    inproc = inprocess_seconds(settings, blob, batches, args.repeats)
    figures = [level_figures(level, inproc) for level in levels]
    return {
        "workload": asdict(Workload()) | {"hidden": list(Workload().hidden)},
        "database": "Postgres" if args.database_url else "fresh SQLite file",
        "trainer": args.trainer,
        "device": str(resolve_device(settings.device)),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch_threads": args.torch_threads,  # the server's ROFU_TORCH_THREADS; None: default
        "workers": args.workers,
        "estimator": args.estimator,
        "torch": torch.__version__,
        "n_data": args.n_data,
        "version": version,
        "final_version": final_version,  # newer than `version` only if the trainer ran
        **{k: getattr(args, k) for k in ("requests", "seconds", "rounds", "warmup", "repeats")},
        "reward_fraction": args.reward_fraction,
        "inproc_seconds": inproc,
        "reward_audit": audit,
        "errors": sum(row["errors"] for row in figures),
        "levels": figures,
        "by_concurrency": by_concurrency(figures),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m rofu.bench.load` and `rofu bench load`."""
    args = parse_args(argv)
    try:
        wrk_binary()  # before a checkpoint is fitted or a server started
    except WrkError as error:
        print(f"rofu bench load: {error}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="rofu-load-") as workdir:
        try:
            result = run(args, Path(workdir))
        except RuntimeError as error:
            print(f"rofu bench load: {error}", file=sys.stderr)
            return 1
    print(format_report(result))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as out:
            json.dump(json_safe(result), out, indent=2)
    audit = result["reward_audit"]
    if audit["missing"] or audit["duplicated"] or audit["wrong_value"]:
        print("rofu bench load: acknowledged rewards were lost or doubled", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
