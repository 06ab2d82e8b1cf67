#!/usr/bin/env bash
# Writes the files that docker/compose.yaml mounts as Docker secrets, unless they exist:
#   docker/secrets/api-keys                one key per line: /v1/select, /v1/reward (Bearer <key>)
#   docker/secrets/admin-api-keys          one key per line: /v1/arms writes, /v1/admin/pin
#   docker/secrets/grafana-admin-password  Grafana's admin password
# Add or rotate a key by editing the file (one per line) and restarting api.
set -euo pipefail
dir="$(cd "$(dirname "$0")" && pwd)/secrets"
mkdir -p "$dir"
chmod 700 "$dir"
for name in api-keys admin-api-keys grafana-admin-password; do
  if [ ! -s "$dir/$name" ]; then
    python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > "$dir/$name"
    # Readable by the containers' non-root users (compose bind-mounts the file as it is);
    # the directory itself stays private to you.
    chmod 644 "$dir/$name"
    echo "wrote $dir/$name"
  fi
done
