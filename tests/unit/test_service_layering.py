"""`service` never imports the replay harness or the benchmarks, nor their extra's packages."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import service

HARNESS = ("replay", "benchmarks")
REPLAY_EXTRA = ("scipy", "matplotlib", "pandas", "tqdm", "httpx")


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_service_module_names_the_harness():
    offenders = {
        f"{path.relative_to(Path(service.__file__).parent.parent)}: {name}"
        for path in Path(service.__file__).parent.rglob("*.py")
        for name in _imported(path)
        if name.split(".")[0] in HARNESS + REPLAY_EXTRA
    }
    assert not offenders, sorted(offenders)


def test_service_and_the_rofu_command_run_without_the_replay_extra():
    program = textwrap.dedent(
        f"""
        import importlib, importlib.abc, pkgutil, sys

        BLOCKED = {REPLAY_EXTRA!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"blocked: {{name}}", name=name)
                return None

        sys.meta_path.insert(0, Block())
        import service
        for module in pkgutil.walk_packages(service.__path__, "service."):
            importlib.import_module(module.name)
        from rofu import cli
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in {HARNESS!r})
        assert not leaked, leaked
        cli.build_parser().parse_args(["serve", "--workers", "2"])
        try:
            cli.main(["replay", "--help"])
        except SystemExit as exc:
            assert exc.code == 2, exc.code
        else:
            raise AssertionError("rofu replay ran without its extra")
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert "pip install 'rofu[replay]'" in result.stderr
