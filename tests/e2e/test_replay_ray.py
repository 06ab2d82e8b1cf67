"""`rofu replay --backend ray` on a local Ray with 2 CPUs: a small study runs to
completion with a worker killed mid-study (Ray retries its run), every run file exactly
once and equal to the same study run locally; an address where nothing answers is a usage
error at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rofu.replay.cli import main
from tests.support import require_module

TIMINGS = {"seconds", "cpu_seconds"}


@pytest.fixture(scope="module")
def ray() -> Iterator[Any]:
    ray = require_module("ray", "scripts/setup.sh (the replay-ray extra)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _study(folder: Path, out: Path) -> list[str]:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(300, 3))
    lines = ["a,b,c,kind"] + [
        f"{a:.4f},{b:.4f},{c:.4f},{'l' if a + b < 0 else 'r'}" for a, b, c in x
    ]
    data = folder / "toy.csv"
    data.write_text("\n".join(lines) + "\n")
    return [
        "--dataset-file", str(data), "--policies", "Uniform,LinUCB,Greedy",
        "--seeds", "0-1", "--rounds", "600", "--out", str(out), "--no-progress",
    ]  # fmt: skip


def _runs(out: Path) -> dict[str, dict]:
    return {
        str(path.relative_to(out)): {
            k: v for k, v in json.loads(path.read_text()).items() if k not in TIMINGS
        }
        for path in sorted((out / "runs").rglob("*.json"))
    }


def _kill_one_run_worker(killed: list[int], stop: threading.Event) -> None:
    """SIGKILL the first Ray worker seen running a run (its title names the task)."""
    while not stop.is_set() and not killed:
        listing = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True)
        for line in listing.stdout.splitlines():
            if "ray::_run_remote" in line:
                pid = int(line.split()[0])
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.05)


def test_ray_study_survives_a_killed_worker_and_matches_a_local_run(ray, tmp_path, capsys):
    on_ray, local = tmp_path / "ray", tmp_path / "local"
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_one_run_worker, args=(killed, stop), daemon=True)
    killer.start()
    try:
        assert main([*_study(tmp_path, on_ray), "--backend", "ray"]) == 0
    finally:
        stop.set()
        killer.join(10)
    assert killed, "no run worker was seen to kill"
    assert main(_study(tmp_path, local)) == 0
    runs = _runs(on_ray)
    assert len(runs) == 6  # 3 policies x 2 seeds, each exactly once
    assert runs == _runs(local)
    assert not list((on_ray / "runs").rglob("*.partial"))
    assert (on_ray / "README.md").is_file()  # the report, as a local study writes it
    assert main([*_study(tmp_path, on_ray), "--backend", "ray"]) == 0  # resumed: nothing to do
    assert "ray: " not in capsys.readouterr().out.split("6 runs")[-1]


def test_ray_address_that_does_not_answer_is_a_usage_error(tmp_path, capsys):
    out = tmp_path / "out"
    argv = [*_study(tmp_path, out), "--backend", "ray"]
    with pytest.raises(SystemExit):
        main([*argv, "--address", "127.0.0.1:9"])  # nothing listens on port 9
    assert "--address 127.0.0.1:9: no Ray cluster answers there" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--workers", "2"])
    assert "--workers does not apply" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*_study(tmp_path, out), "--address", "127.0.0.1:9"])
    assert "--address goes only with --backend ray" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--retries", "-1"])
    assert "--retries must be >= 0" in capsys.readouterr().err
    assert not out.exists()
