#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs rofu: the client, the server and the dev,
# replay, replay-ray (Ray), vw and export extras, then Open Bandit Pipeline for the tests
# that check rofu's OBP export with it. Safe to re-run: it only reinstalls when
# pyproject.toml or this file changed. torch==2.13.0 goes first so that pip takes the CPU
# wheel on disk instead of downloading a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${ROFU_PYTHON:-python3.11}
say() { echo "setup.sh: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $python"
  "$python" -m venv .venv
fi
stamp=.venv/.rofu-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/setup.sh -nt "$stamp" ]; then
  say "1/4 upgrading pip"
  .venv/bin/python -m pip install --quiet --upgrade pip
  say "2/4 installing torch 2.13.0 (the CPU wheel; about a minute)"
  .venv/bin/python -m pip install --quiet torch==2.13.0
  say "3/4 installing rofu with its server, dev, replay, replay-ray, vw and export extras (about a minute)"
  .venv/bin/python -m pip install --quiet -e '.[server,dev,replay,replay-ray,vw,export]'
  # obp 0.5.7 (its latest release) declares Python < 3.11 and pins numpy 1.23, torch 1.12,
  # ...; it runs on 3.11 with current ones, so it goes in without its pins, beside what it
  # imports (tests/e2e/test_third_party_tools.py).
  say "4/4 installing Open Bandit Pipeline 0.5.7 without its pins (a few seconds)"
  .venv/bin/python -m pip install --quiet scikit-learn seaborn pyyaml
  .venv/bin/python -m pip install --quiet --no-deps --ignore-requires-python obp==0.5.7
  touch "$stamp"
  say "done"
fi
