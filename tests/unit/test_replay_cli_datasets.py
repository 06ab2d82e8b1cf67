"""`rofu replay` and its data sets: checked before anything runs, a user's file end to end,
and a default output folder that no committed report lives in."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rofu.replay.arguments import DEFAULT_OUT, build_parser
from rofu.replay.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _toy_csv(folder: Path) -> Path:
    """300 rows, a header and two numeric features; the class is the sign of the first."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 2))
    kinds = np.where(x[:, 0] < 0, "left", "right")
    lines = ["x,y,kind"] + [f"{a:.4f},{b:.4f},{k}" for (a, b), k in zip(x, kinds, strict=True)]
    path = folder / "toy.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_runs_a_csv_file_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [
        "--dataset-file", str(_toy_csv(tmp_path)), "--label-column", "-1",
        "--policies", "Uniform,LinUCB", "--seeds", "0", "--rounds", "300",
        "--out", str(out), "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 0
    cells = json.loads((out / "results.json").read_text())["cells"]
    assert set(cells) == {"file:toy"}
    assert set(cells["file:toy"]) == {"Uniform", "LinUCB"}
    # a linear boundary: LinUCB learns it, Uniform is right half the time
    assert cells["file:toy"]["Uniform"]["mean"] == pytest.approx(150, rel=0.2)
    assert cells["file:toy"]["LinUCB"]["mean"] < cells["file:toy"]["Uniform"]["mean"] / 3
    assert (out / "runs" / "file:toy" / "LinUCB" / "seed0-T300.json").is_file()
    readme = (out / "README.md").read_text()
    assert readme.startswith("# Replay report: toy.csv\n")  # the file, not the protocol
    assert json.loads((out / "results.json").read_text())["title"] == "Replay report: toy.csv"
    assert "`rofu replay --dataset-file" in readme
    assert "| file:toy |" in readme
    rebuilt = main([*argv, "--report-only"])  # every run done: the same title
    assert rebuilt == 0
    assert (out / "README.md").read_text().startswith("# Replay report: toy.csv\n")


def test_replay_runs_a_file_beside_registered_data_sets_under_its_own_name(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    argv = ["--dataset-file", str(_toy_csv(tmp_path)), "--dataset-name", "toy-2"]
    argv += ["--datasets", "wheel", "--policies", "Uniform", "--seeds", "0", "--rounds", "40"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    assert set(json.loads((out / "results.json").read_text())["cells"]) == {"toy-2", "wheel"}


def _bad_csv(folder: Path) -> Path:
    path = folder / "bad.csv"
    path.write_text("1,2,a\n3,4,b\noops,5,a\n")
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--datasets", "vehicle"], "unknown data set 'vehicle'; known: mushroom, statlog"),
        (["--datasets", "wheel,Vehicle", "--dataset-file", "{toy}"], "unknown data set 'Vehicle'"),
        (["--datasets", "statlog", "--data-dir", "{empty}"], "lacks statlog_shuttle/shuttle.trn"),
        (["--datasets", "statlog", "--data-dir", "{empty}/absent"], "not found: pass --data-dir"),
        (["--dataset-file", "{empty}/absent.csv"], "absent.csv: cannot read it: No such file"),
        (["--dataset-file", "{bad}"], "bad.csv: line 3, column 0 (0-based): 'oops' is not a"),
        (["--dataset-file", "{toy}", "--label-column", "3"], "--label-column 3 is out of range"),
        (["--dataset-file", "{toy}", "--label-column", "x"], "--label-column: invalid int value"),
        (["--label-column", "0"], "--label-column: only with --dataset-file"),
        (["--delimiter", ";", "--dataset-name", "a"], "--delimiter, --dataset-name: only with"),
        (["--dataset-file", "{toy}", "--dataset-name", "Statlog"], "a registered data set's name"),
        (["--dataset-file", "{toy}", "--dataset-name", "a/b"], "must start with a letter or"),
        (["--dataset-file", "{toy}", "--delimiter", "::"], "one character, tab or space"),
        (["--dataset-file", "{toy}", "--delimiter", ";"], "has one column"),
        (["--combine", "{empty}", "--dataset-file", "{toy}"], "nor --dataset-file"),
    ],
)
def test_replay_refuses_bad_data_sets_before_running_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "empty").mkdir()
    paths = {"toy": _toy_csv(tmp_path), "bad": _bad_csv(tmp_path), "empty": tmp_path / "empty"}
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main([*(arg.format(**paths) for arg in argv), "--out", str(out), "--no-progress"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("rofu replay: error: ")
    assert message in last
    assert not out.exists()


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_default_out_folder_is_git_ignored() -> None:
    out = DEFAULT_OUT / build_parser().parse_args([]).protocol  # main's default
    assert _git("check-ignore", "-q", str(out / "README.md")).returncode == 0
    assert _git("check-ignore", "-q", str(DEFAULT_OUT / "ope" / "x.md")).returncode == 0


def _readme_replay_commands() -> list[list[str]]:
    """Every line of the README and docs/ that runs `rofu replay`, after environment
    settings such as `OMP_NUM_THREADS=1` (which the long studies' commands start with)."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(path.read_text() for path in files).replace("\\\n", " ")
    lines = [re.sub(r"^(\w+=\S*\s+)*", "", line.strip()) for line in text.splitlines()]
    return [shlex.split(line, comments=True) for line in lines if line.startswith("rofu replay ")]


def test_no_readme_replay_command_writes_into_a_committed_report() -> None:
    """A README command may resume a study from committed run files (a rerun skips every
    run whose file exists and never rewrites it), but no committed report file may lie
    where it writes its report."""
    commands = _readme_replay_commands()
    assert len(commands) >= 3
    for command in commands:
        words = [word.strip("[]") for word in command]
        out = words[words.index("--out") + 1] if "--out" in words else str(DEFAULT_OUT)
        committed = _git("ls-files", out).stdout.splitlines()
        reports = [path for path in committed if not path.startswith(f"{out.rstrip('/')}/runs/")]
        assert not reports, f"{shlex.join(command)} writes into {out}, over {reports[:3]}"
