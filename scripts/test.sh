#!/usr/bin/env bash
# Sets up the environment and runs the whole test suite: lint, types, then every tier
# (unit, integration, e2e, sim). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
set +e
ROFU_REQUIRE_SERVICES=1 .venv/bin/python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
  status=0
fi
exit "$status"
