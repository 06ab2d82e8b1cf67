"""A mistake in the settings is one line naming the setting, its value and what is wrong,
and exit status 2; `rofu --debug` shows the traceback instead."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from rofu.cli import configuration_errors
from rofu.service.settings import Settings


def _rofu(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rofu", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "ROFU_DATABASE_URL": "sqlite:///nowhere/x.sqlite", **env},
    )


def test_cli_config_error_is_one_line_naming_the_setting():
    result = _rofu("migrate", ROFU_CONTEXT_DIM="abc")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "rofu: configuration error: ROFU_CONTEXT_DIM='abc': Input should be a valid integer, "
        "unable to parse string as an integer"
    ]
    assert not os.path.exists("nowhere")


def test_cli_config_error_refuses_a_select_queue_bound_below_one():
    result = _rofu("serve", ROFU_SELECT_QUEUE_MAX="-1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "rofu: configuration error: ROFU_SELECT_QUEUE_MAX='-1': Input should be greater than "
        "or equal to 1"
    ]


def test_cli_config_error_shows_the_traceback_with_debug():
    result = _rofu("--debug", "migrate", ROFU_CONTEXT_DIM="abc")
    assert result.returncode == 1
    assert "Traceback" in result.stderr
    assert "ValidationError" in result.stderr


@pytest.mark.parametrize(
    ("kwargs", "line"),
    [
        ({"estimator": "ntk-closed"}, "l2 must be > 0 for estimator 'ntk-closed', got 0.0"),
        ({"arms": [{"id": "a b"}]}, "ROFU_ARMS[0][id]='a b': String should match pattern"),
        ({"port": 0}, "ROFU_PORT=0: Input should be greater than or equal to 1"),
        (
            {"select_queue_max": 0},
            "ROFU_SELECT_QUEUE_MAX=0: Input should be greater than or equal to 1",
        ),
        (
            {"select_queue_max": -4},
            "ROFU_SELECT_QUEUE_MAX=-4: Input should be greater than or equal to 1",
        ),
        (
            {"learners": ["mlp", "tree"]},
            "ROFU_LEARNERS=['mlp', 'tree']: learners must name each of mlp, "
            "sgd-decay, linear at most once",
        ),
    ],
)
def test_cli_config_errors_name_each_mistake(kwargs, line):
    with pytest.raises(ValidationError) as caught:
        Settings(_env_file=None, **kwargs)
    (text,) = configuration_errors(caught.value)
    assert text.startswith("rofu: configuration error: " + line), text
