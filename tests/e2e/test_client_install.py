"""The client alone: a fresh venv gets `pip install <this checkout>` (no extra), which brings
httpx and pydantic and no ML or server stack, and its SDK drives a real `rofu serve`
(started from the main environment): select, reward and the decision log.

The package is installed from a copy of what it is built from (pyproject.toml, README.md,
rofu/), so the build leaves nothing in the checkout.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from rofu.service.settings import ArmSpec, Settings
from tests.support import ROOT, seed_checkpoint, service_process

ARMS = ["item-0", "item-1", "item-2"]
ADMIN_KEY = "client-only-admin-key-0123"
HEAVY = ("torch", "numpy", "rofu.service", "rofu.models", "fastapi", "sqlalchemy")

SDK = """
import json, sys
from rofu.client import RofuClient

with RofuClient(sys.argv[1], api_key=sys.argv[2]) as rofu:
    decision = rofu.select([0.2, -0.4, 0.9, 0.1], arms=["item-0", "item-2"])
    rewarded = rofu.reward(decision.event_id, 1.0)
    again = rofu.reward(decision.event_id, 1.0)
    records = list(rofu.export(page_size=1))
print(json.dumps({
    "decision": decision.model_dump(mode="json"),
    "duplicates": [rewarded.duplicate, again.duplicate],
    "records": [r.model_dump(mode="json") for r in records],
}))
"""


def _run(*command: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=300, check=check
    )


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding rofu as `pip install rofu` installs it: the client only."""
    if shutil.which("python3.11") is None:
        pytest.skip("python3.11 is not on PATH")
    folder = tmp_path_factory.mktemp("client")
    source = folder / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "rofu", source / "rofu", ignore=shutil.ignore_patterns("__pycache__"))
    venv = folder / "venv"
    _run("python3.11", "-m", "venv", venv)
    pip = (venv / "bin" / "python", "-m", "pip", "install", "--quiet", source)
    installed = _run(*pip, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return venv


def test_client_install_brings_no_server_stack(client_venv: Path) -> None:
    python = client_venv / "bin" / "python"
    assert _run(python, "-c", "import torch", check=False).returncode != 0
    assert _run(python, "-c", "import models", check=False).returncode != 0
    timed = _run(python, "-X", "importtime", "-c", "import rofu.client")
    modules = [line.split("|")[-1].strip() for line in timed.stderr.splitlines() if "|" in line]
    assert "rofu.client.schemas" in modules  # the listing is read
    heavy = [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert not heavy, heavy
    serve = _run(client_venv / "bin" / "rofu", "serve", check=False)
    assert serve.returncode == 2
    assert serve.stderr.strip().splitlines() == [
        "rofu serve: this command needs the server: pip install 'rofu[server]'"
    ]


def test_client_install_drives_a_real_rofu_serve(client_venv: Path, tmp_path: Path) -> None:
    database = tmp_path / "rofu.sqlite"
    settings = Settings(
        database_url=f"sqlite:///{database}",
        context_dim=4,
        hidden=(16,),
        arms=[ArmSpec(id=a) for a in ARMS],
    )
    seed_checkpoint(settings, n_rows=50)
    env = {
        "ROFU_DATABASE_URL": settings.database_url,
        "ROFU_CONTEXT_DIM": "4",
        "ROFU_HIDDEN": "[16]",
        "ROFU_ARMS": json.dumps([{"id": a} for a in ARMS]),
        "ROFU_EMBEDDED_TRAINER": "false",
        "ROFU_ADMIN_API_KEYS": json.dumps([ADMIN_KEY]),
    }
    with service_process(env, tmp_path / "service.log") as base_url:
        program = textwrap.dedent(SDK)
        ran = _run(client_venv / "bin" / "python", "-c", program, base_url, ADMIN_KEY, check=False)
    assert ran.returncode == 0, ran.stderr[-3000:]
    answer = json.loads(ran.stdout)
    decision, (record,) = answer["decision"], answer["records"]
    assert decision["arm"] in ("item-0", "item-2")
    assert (decision["model_version"], decision["policy"]) == (1, "rofu")
    assert answer["duplicates"] == [False, True]
    assert (record["event_id"], record["arm"], record["reward"]) == (
        decision["event_id"],
        decision["arm"],
        1.0,
    )
    assert record["candidates"] == ["item-0", "item-2"]
    assert record["scores"] == decision["scores"]
