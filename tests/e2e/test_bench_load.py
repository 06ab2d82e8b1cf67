"""`rofu bench load` end to end: a real `rofu serve` driven by wrk on /select and on the
floor, then by the Python client's /select + /reward mix, the rewards audited; a short
run whose JSON holds every headline key (no time is asserted)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support import unavailable


def test_bench_load_drives_select_and_the_floor_with_wrk(tmp_path: Path) -> None:
    if shutil.which("wrk") is None:
        unavailable("wrk", FileNotFoundError("no `wrk` on PATH"))
    out = tmp_path / "load.json"
    command = [sys.executable, "-m", "rofu.bench.load", "--concurrency", "1,4"]
    command += ["--seconds", "2", "--rounds", "1", "--requests", "40", "--warmup", "2"]
    command += ["--n-data", "400", "--repeats", "1", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["by_concurrency"]) == {"1", "4"}
    for level in result["by_concurrency"].values():
        assert level["select_per_s"] > 0
        assert level["floor_per_s"] > 0
        assert 0 < level["p50_ms"] <= level["p99_ms"]
        assert level["floor_p99_ms"] > 0
        assert level["errors"] == 0
    audit = result["reward_audit"]
    assert audit["acknowledged"] > 0
    assert (audit["missing"], audit["duplicated"], audit["wrong_value"]) == (0, 0, 0)
    assert "floor (/v1/select/validate" in done.stdout
