"""`rofu.service` and the `rofu` command run without the replay extra's packages (the import
direction itself is `test_layering`'s)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HARNESS = ("rofu.replay", "rofu.bench", "rofu.evaluation")
REPLAY_EXTRA = ("scipy", "matplotlib", "pandas", "tqdm")


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
        import rofu.service
        for module in pkgutil.walk_packages(rofu.service.__path__, "rofu.service."):
            importlib.import_module(module.name)
        from rofu import cli
        leaked = sorted(m for m in sys.modules if m.startswith({HARNESS!r}))
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
