"""`rofu.client` needs httpx and pydantic only: it imports and works with the ML core, the
service and their stacks blocked, and the `rofu` command without the server says what to
install (the import direction itself is `test_layering`'s)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

#: What an app calling the service must not need.
SERVER = ("torch", "numpy", "fastapi", "starlette", "sqlalchemy", "pydantic_settings")

BLOCKER = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED or name.startswith(BLOCKED_PACKAGES):
            raise ModuleNotFoundError(f"blocked: {name}", name=name)
        return None

sys.meta_path.insert(0, Block())
"""


def _run(program: str, blocked: tuple[str, ...], packages: tuple[str, ...] = ()) -> str:
    """Run `program` with those modules blocked; its standard error."""
    prelude = f"BLOCKED = {blocked!r}\nBLOCKED_PACKAGES = {packages!r}\n" + BLOCKER
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(program)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    return result.stderr


def test_client_selects_rewards_and_reads_the_log_with_the_server_stacks_blocked():
    program = """
        import json, sys
        import httpx
        from rofu.client import DecisionRecord, RofuClient, RofuError, SelectResponse

        SCORE = {"arm": "a", "mean": 0.5, "bonus": 0.1, "ucb": 0.6}
        DECISION = {"event_id": "e", "arm": "a", "model_version": 2, "propensity": 1.0,
                    "explore": True, "policy": "rofu", "scores": [SCORE]}
        RECORD = {"event_id": "e", "created_at": "2026-12-01T12:00:00Z", "context": [1.0],
                  "candidates": ["a"], "arm": "a", "slot": 0, "propensity": 1.0,
                  "probabilities": [1.0], "model_version": 2, "policy": "rofu",
                  "explore": True, "scores": [SCORE], "reward": 1.0,
                  "reward_received_at": None, "late": False}

        def answer(request):
            if request.url.path == "/v1/select":
                return httpx.Response(200, json={**DECISION, **json.loads(request.content)})
            if request.url.path == "/v1/reward":
                error = {"code": "not_found", "message": "no decision e", "field": "event_id"}
                return httpx.Response(404, json={"error": error})
            return httpx.Response(200, json=[RECORD])

        with RofuClient("http://rofu", transport=httpx.MockTransport(answer)) as rofu:
            decision = rofu.select([1.0], event_id="e", arms=["a"])
            assert isinstance(decision, SelectResponse) and decision.scores[0].ucb == 0.6
            try:
                rofu.reward("e", 1.0)
            except RofuError as error:
                assert (error.status, error.code, error.field) == (404, "not_found", "event_id")
            else:
                raise AssertionError("a 404 passed")
            (record,) = rofu.export()
        assert isinstance(record, DecisionRecord) and record.chosen_index == 0
        assert record.active and record.reward == 1.0
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED
                        or m.startswith(BLOCKED_PACKAGES))
        assert not leaked, leaked
        print("ok")
        """
    _run(program, SERVER, ("rofu.models", "rofu.service", "rofu.replay", "rofu.evaluation"))


def test_rofu_command_without_the_server_says_to_install_it():
    program = """
        from rofu import cli

        for command in (["serve"], ["migrate", "--revision", "head"], ["export"]):
            assert cli.main(command) == 2, command
        try:
            cli.main(["replay", "--help"])
        except SystemExit as exc:
            assert exc.code == 2, exc.code
        else:
            raise AssertionError("rofu replay ran without the server")
        print("ok")
        """
    lines = _run(program, SERVER).splitlines()
    assert lines[:3] == [
        f"rofu {command}: this command needs the server: pip install 'rofu[server]'"
        for command in ("serve", "migrate", "export")
    ]
    assert "pip install 'rofu[replay]'" in lines[3]


def test_rofu_command_names_every_service_command():
    from rofu import cli
    from rofu.service import cli as service_cli

    assert cli.SERVER_COMMANDS == service_cli.SERVICE_COMMANDS
    assert cli.service_cli() is service_cli
