"""Every runnable code block of README.md and docs/*.md, run against a real `rofu serve`.

Two servers run the demo configuration (`config/demo.toml`) on SQLite files, each with a
stored checkpoint 1: an open one, as `bash scripts/serve.sh` starts it, and one with a
client and an admin key for the blocks that use `CLIENT_KEY` or `ADMIN_KEY`. A block's
`localhost:8000` becomes its server's address; shell blocks run under `set -euo pipefail`
with curl failing on any 4xx or 5xx; every block must print something, and every
`print(` of a Python block must print (a loop over nothing is a broken example). The blocks run
in reading order, README first (a later block may use an event an earlier one made).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rofu.service.settings import Settings
from tests.docs_blocks import ROOT, Block, all_blocks
from tests.support import seed_checkpoint, service_process

RUNNABLE = [block for block in all_blocks() if block.runs]
CLIENT_KEY = "client-key-for-the-docs-0001"
ADMIN_KEY = "admin-key-for-the-docs-0001"
CURL = 'curl() { command curl --fail-with-body --show-error --max-time 60 "$@"; }\n'
#: runs a Python block (argv[1]) and fails if a line with `print(` never printed
PYTHON = """
import builtins, sys
code, printed, real_print = sys.argv[1], set(), builtins.print
def traced(*args, **kwargs):
    frame = sys._getframe(1)
    if frame.f_code.co_filename == "<doc>":
        printed.add(frame.f_lineno)
    real_print(*args, **kwargs)
builtins.print = traced
exec(compile(code, "<doc>", "exec"), {"__name__": "__main__"})
lines = {n for n, line in enumerate(code.splitlines(), 1) if "print(" in line}
if lines - printed:
    sys.exit(f"the print() on line(s) {sorted(lines - printed)} never printed")
"""


@dataclass(frozen=True)
class Server:
    """A running server and the environment a block runs with against it."""

    url: str
    env: dict[str, str]


@contextlib.contextmanager
def _start(tmp: Path, name: str, keyed: bool) -> Iterator[Server]:
    database_url = f"sqlite:///{tmp}/{name}.sqlite"
    env = {
        "ROFU_CONFIG_FILE": str(ROOT / "config/demo.toml"),
        "ROFU_DATABASE_URL": database_url,
        "ROFU_EMBEDDED_TRAINER": "false",  # the blocks' scores come from checkpoint 1
        "ROFU_TORCH_THREADS": "1",
        "CLIENT_KEY": CLIENT_KEY,
        "ADMIN_KEY": ADMIN_KEY,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    if keyed:
        env |= {"ROFU_API_KEYS": f'["{CLIENT_KEY}"]', "ROFU_ADMIN_API_KEYS": f'["{ADMIN_KEY}"]'}
    seed_checkpoint(Settings(database_url=database_url, context_dim=8))  # the demo's network
    with service_process(env, tmp / f"{name}.log") as url:
        yield Server(url, env)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[bool, Server]]:
    """{False: the open server, True: the one with keys}."""
    tmp = tmp_path_factory.mktemp("docs")
    with contextlib.ExitStack() as stack:
        yield {key: stack.enter_context(_start(tmp, f"keyed-{key}", key)) for key in (False, True)}


def _script(block: Block, url: str) -> str:
    text = block.text.replace("http://127.0.0.1:8000", url)
    return text.replace("localhost:8000", url).replace("127.0.0.1:8000", url)


def _run(block: Block, server: Server, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = _script(block, server.url)
    if block.lang == "python":
        command = [sys.executable, "-c", PYTHON, script]
    else:
        command = ["bash", "-c", "set -euo pipefail\n" + CURL + script]
    return subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, **server.env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_docs_e2e_runs_most_blocks() -> None:
    assert len(RUNNABLE) >= 12
    assert {block.lang for block in RUNNABLE} == {"bash", "python"}


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.where for block in RUNNABLE])
def test_docs_block_runs_against_a_real_server(
    block: Block, servers: dict[bool, Server], tmp_path: Path
) -> None:
    keyed = "ADMIN_KEY" in block.text or "CLIENT_KEY" in block.text
    result = _run(block, servers[keyed], tmp_path)
    stdout, stderr = result.stdout[-3000:], result.stderr[-3000:]
    output = f"{block.where}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    assert result.returncode == 0, output
    assert result.stdout.strip(), f"{block.where} printed nothing\n{output}"
