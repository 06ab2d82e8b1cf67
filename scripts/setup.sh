#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs rofu: the client, the server and the dev,
# replay, vw and export extras. Safe to re-run: it only reinstalls when pyproject.toml
# changed. torch==2.13.0 goes first so that pip takes the CPU wheel on disk instead of
# downloading a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${ROFU_PYTHON:-python3.11}
say() { echo "setup.sh: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $python"
  "$python" -m venv .venv
fi
stamp=.venv/.rofu-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  say "1/3 upgrading pip"
  .venv/bin/python -m pip install --quiet --upgrade pip
  say "2/3 installing torch 2.13.0 (the CPU wheel; about a minute)"
  .venv/bin/python -m pip install --quiet torch==2.13.0
  say "3/3 installing rofu with its server, dev, replay, vw and export extras (about a minute)"
  .venv/bin/python -m pip install --quiet -e '.[server,dev,replay,vw,export]'
  touch "$stamp"
  say "done"
fi
