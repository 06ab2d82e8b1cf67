#!/usr/bin/env bash
# Makes sure Postgres (127.0.0.1:5432, trust auth, database `test`) and Redis
# (127.0.0.1:6379) answer: starts them when installed but stopped, installs them with
# apt-get when absent. The integration and e2e tests need both. Also installs the
# `prometheus` binary (tests/e2e/test_prometheus.py starts its own server with it) and
# `wrk`, the native load generator of `rofu bench load` (tests/e2e/test_bench_load.py).
set -euo pipefail

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
  local who=""
  if [ "$(id -u)" -eq 0 ]; then who=" (as root)"; else who=" (with sudo)"; fi
  echo "services.sh: installing $* with apt-get$who" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}

wait_for() {  # wait_for <what> <command...>
  local what=$1; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "services.sh: $what did not come up" >&2
  return 1
}

ensure_postgres() {
  if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then return 0; fi
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    apt_install postgresql
    local hba
    hba=$(ls /etc/postgresql/*/main/pg_hba.conf | head -n 1)
    as_root sed -i '1i host all all 127.0.0.1/32 trust\nlocal all all trust' "$hba"
  fi
  echo "services.sh: starting Postgres" >&2
  as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start \
    || true
  wait_for "Postgres" pg_isready -q -h 127.0.0.1 -p 5432
}

ensure_test_database() {
  local exists
  exists=$(psql -h 127.0.0.1 -U postgres -d postgres -tAc \
    "select 1 from pg_database where datname = 'test'")
  if [ "$exists" != "1" ]; then
    echo "services.sh: creating the Postgres database test" >&2
    psql -h 127.0.0.1 -U postgres -d postgres -qc "create database test"
  fi
}

ensure_redis() {
  if redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then return 0; fi
  if ! command -v redis-server >/dev/null 2>&1; then
    apt_install redis-server
  fi
  echo "services.sh: starting Redis on 127.0.0.1:6379" >&2
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
  wait_for "Redis" sh -c 'redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG'
}

ensure_prometheus() {  # the binary only: tests/e2e/test_prometheus.py runs its own server
  if command -v prometheus >/dev/null 2>&1; then return 0; fi
  apt_install --no-install-recommends prometheus
  # Where systemd runs, the package enables and starts its system service: leave it off.
  if [ -d /run/systemd/system ]; then
    as_root systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
}

ensure_wrk() {
  if command -v wrk >/dev/null 2>&1; then return 0; fi
  apt_install --no-install-recommends wrk
}

ensure_postgres
ensure_test_database
ensure_redis
ensure_prometheus
ensure_wrk
