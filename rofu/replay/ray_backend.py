"""`rofu replay --backend ray`: every pending run of a study as a Ray task.

Each run is one task (one CPU; a quarter of a GPU with `--device cuda`) that runs the job
into a folder of its own on whichever node takes it and returns its run file's bytes;
the driver writes them under `--out`, so no shared file system is needed, and a run file
is written once, by the driver, only when its task succeeded. A task that fails (an
exception, or its worker killed) is retried by Ray up to `retries` times; a run that
still fails is reported and the others go on. Finished runs are never redone: the plan
skips every run whose file exists, so an interrupted study resumes by running the command
again. Progress (runs done, failed, the ETA) is printed as runs finish.

Ray is an optional extra (`pip install 'rofu[replay-ray]'`), imported only here.
"""

from __future__ import annotations

import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rofu.replay.runner import Job, run_job
from rofu.replay.simulation.datafile import ClassificationFile
from rofu.replay.simulation.oracle import ORACLE, OracleConfig

#: The share of a GPU one run takes with `--device cuda` (four runs per GPU).
GPU_SHARE = 0.25


class RayUnavailable(RuntimeError):
    """Ray is not installed, or no cluster answers at the address given."""


@dataclass(frozen=True)
class RayOutcome:
    """What a study on Ray did: the runs written and the runs that failed (with why)."""

    written: list[Path]
    failed: list[tuple[Job, str]]


def connect(address: str | None) -> Any:
    """The `ray` module, connected: to `address`, or to a new local instance.

    Raises:
        RayUnavailable: Ray is not installed, or nothing answers at `address`.
    """
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--backend ray needs Ray: pip install 'rofu[replay-ray]'") from None
    if address is not None:
        _probe(address)
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = address or "a new local instance"
            raise RayUnavailable(
                f"--address {where}: no Ray cluster answers there ({exc})"
            ) from None
    return ray


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """A TCP connection to a `host:port` (or `ray://host:port`) address, so that one that
    does not answer is an error now rather than Ray's minutes of retries; `auto` and
    `local` are left to Ray.

    Raises:
        RayUnavailable: nothing accepts a connection there within `timeout_s`.
    """
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as exc:
        raise RayUnavailable(
            f"--address {address}: no Ray cluster answers there "
            f"({type(exc).__name__}: {exc}); expected host:port of its head node"
        ) from None


def _run_remote(
    job: Job,
    data_dir: str | None,
    device: str,
    file: ClassificationFile | None,
    oracle: OracleConfig | None,
) -> tuple[str, bytes]:
    """On a Ray worker: the job run into a folder of its own; (its run file's path under
    `--out`, its bytes). The oracle cache is per node, shared by its tasks."""
    with tempfile.TemporaryDirectory(prefix="rofu-ray-run-") as folder:
        out = Path(folder)
        cache = Path(tempfile.gettempdir()) / "rofu-ray-oracle"
        path = run_job(job, out, data_dir, device, file, oracle, oracle_cache=cache)
        return str(path.relative_to(out)), path.read_bytes()


def run_on_ray(
    jobs: Sequence[Job],
    out: Path,
    *,
    address: str | None,
    retries: int,
    data_dir: Path | None,
    device: str,
    files: Sequence[ClassificationFile] = (),
    oracle: OracleConfig | None = ORACLE,
    progress: bool = True,
) -> RayOutcome:
    """Run every job whose run file is missing as a Ray task; write each run file under
    `out` as its task returns.

    Raises:
        RayUnavailable: see `connect`, before any job is submitted.
    """
    ray = connect(address)
    todo = [job for job in jobs if not job.done(out)]
    by_name = {file.name: file for file in files}
    remote = ray.remote(_run_remote).options(
        num_cpus=1,
        num_gpus=GPU_SHARE if device == "cuda" else 0,
        max_retries=retries,
        retry_exceptions=True,
    )
    folder = None if data_dir is None else str(data_dir)
    pending = {
        remote.remote(job, folder, device, by_name.get(job.bandit), oracle): job for job in todo
    }
    written: list[Path] = []
    failed: list[tuple[Job, str]] = []
    start = time.monotonic()
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        job = pending.pop(ready[0])
        try:
            relative, blob = ray.get(ready[0])
        except Exception as exc:  # retried `retries` times already
            failed.append((job, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))
            state = "failed"
        else:
            state = "done"
            path = out / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".json.partial")
            partial.write_bytes(blob)
            partial.replace(path)  # atomic: a run file is whole or absent
            written.append(path)
        if progress:
            last = f"{state} {job.bandit}/{job.policy}/seed{job.seed}"
            print(_progress(len(todo), len(written), len(failed), start, last), flush=True)
    return RayOutcome(written, failed)


def _progress(total: int, done: int, failed: int, start: float, last: str) -> str:
    finished = done + failed
    elapsed = time.monotonic() - start
    left = elapsed / finished * (total - finished) if finished else float("nan")
    return f"ray: {finished}/{total} ({done} done, {failed} failed), ETA {left:.0f} s: {last}"
