"""`rofu serve`: worker processes and the logging every worker gets (uvicorn not started)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from rofu import cli
from rofu.service import migrate
from rofu.service.settings import get_settings


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[dict[str, Any]]]:
    """A clean ROFU_* environment on a fresh SQLite file; uvicorn.run only records its call."""
    for name in list(os.environ):
        if name.upper().startswith("ROFU_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ROFU_DATABASE_URL", f"sqlite:///{tmp_path}/serve.sqlite")
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append({"app": app, **kw}))
    get_settings.cache_clear()
    yield calls
    get_settings.cache_clear()


def test_cli_serve_one_worker_by_default(served: list[dict[str, Any]]) -> None:
    assert cli.main(["serve"]) == 0
    (call,) = served
    assert (call["app"], call["factory"], call["workers"]) == (
        "rofu.service.api.app:create_app",
        True,
        1,
    )
    assert call["log_config"]["root"]["level"] == "INFO"  # our loggers, in every worker


def test_cli_serve_refuses_workers_with_the_in_process_trainer(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["serve", "--workers", "2"]) == 2
    assert "ROFU_EMBEDDED_TRAINER=false" in capsys.readouterr().err
    assert cli.main(["serve", "--workers", "0"]) == 2
    assert served == []


def test_cli_serve_workers_migrate_sqlite_once_then_start(
    served: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROFU_EMBEDDED_TRAINER", "false")
    assert cli.main(["serve", "--workers", "2", "--log-level", "warning"]) == 0
    (call,) = served
    assert call["workers"] == 2
    assert call["log_config"]["root"]["level"] == "WARNING"
    url = get_settings().database_url
    assert migrate.current_revision_of(url) == migrate.head_revision()


def test_rofu_bench_help_and_a_missing_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--help"]) == 0
    assert "kernel" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        cli.main(["bench"])
    assert exited.value.code == 2
    assert "choose a benchmark: kernel, load" in capsys.readouterr().err


def test_rofu_refuses_arguments_a_service_command_does_not_take(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["migrate", "--nonsense"])
    assert exited.value.code == 2
    assert "unrecognised arguments: --nonsense" in capsys.readouterr().err
