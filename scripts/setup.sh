#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs rofu with its dev tools. Safe to re-run: it only
# reinstalls when pyproject.toml changed. torch==2.13.0 goes first so that pip takes the
# CPU wheel on disk instead of downloading a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${ROFU_PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=.venv/.rofu-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet torch==2.13.0
  .venv/bin/python -m pip install --quiet -e '.[dev,replay,vw]'
  touch "$stamp"
fi
