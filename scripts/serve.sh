#!/usr/bin/env bash
# Sets up the environment and runs the service on its embedded default: a SQLite file
# (var/rofu.sqlite), the in-process checkpoint bus and the trainer in a background thread,
# with the demo configuration in config/demo.toml. Extra arguments go to `rofu serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export ROFU_CONFIG_FILE=${ROFU_CONFIG_FILE:-config/demo.toml}
.venv/bin/rofu migrate
exec .venv/bin/rofu serve "$@"
