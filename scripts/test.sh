#!/usr/bin/env bash
# `make test`: a private data dir and Redis on a free port, Django's checks, ruff,
# then pytest; afterwards stop every process the tests left under the data dir.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

TEST_TMP=$(mktemp -d /tmp/mtc-test.XXXXXX)
# Jobs run as their owners' accounts: they pass through (never list) the run's dir.
chmod 0711 "$TEST_TMP"
# Each run makes its Unix accounts in its own block of 200 uids, so runs side by side
# never share one; cleanup removes the block's accounts.
UID_BLOCK=$(( 30000 + ( $(printf '%s' "$TEST_TMP" | cksum | cut -d' ' -f1) % 150 ) * 200 ))
export MTC_UID_RANGE="$UID_BLOCK-$((UID_BLOCK + 199))"
export MTC_DATA_DIR="$TEST_TMP/data"
export MTC_CELERY_EAGER=1
# Tests run node checks on demand; agent daemons on every test node would only
# compete for the two cores.
export MTC_LOCAL_NODE_AGENTS=0
mkdir -p "$MTC_DATA_DIR"
REDIS_PORT=$($PY -c 'from mtc.devstack import free_port; print(free_port())')
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$TEST_TMP" --daemonize no >"$TEST_TMP/redis.log" 2>&1 &
REDIS_PID=$!

cleanup() {
  kill "$REDIS_PID" 2>/dev/null
  # Slurm daemons and job steps the tests started all mention the data dir.
  $PY - "$TEST_TMP" <<'PYEOF'
import sys
from clusters.providers import procs
left = procs.processes_mentioning(sys.argv[1])
if left:
    print(f"test: stopping {len(left)} leftover process(es)")
    procs.stop(left)
PYEOF
  getent passwd | awk -F: -v lo="$UID_BLOCK" -v hi="$((UID_BLOCK + 199))" \
    '$3 >= lo && $3 <= hi {print $1}' | while read -r name; do
    userdel "$name" 2>/dev/null; groupdel "$name" 2>/dev/null
  done
  rm -rf "$TEST_TMP"
}
trap cleanup EXIT

for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

set -e
echo "== django checks"
$PY manage.py check --fail-level WARNING
$PY manage.py makemigrations --check --dry-run >/dev/null || {
  echo "test: models changed without a migration"; exit 1; }
echo "== ruff"
.venv/bin/ruff check .
echo "== import layers"
.venv/bin/lint-imports --no-cache
echo "== identity"
# The identity tests need other accounts to run mtc's Python (README, Identity).
DJANGO_SETTINGS_MODULE=mtc.settings $PY -c 'import django; django.setup(); from identity.selectors import identity_mode, single_user_reason as r; print(identity_mode(), r())'
echo "== pytest"
set +e
$PY -m pytest "$@"
rc=$?
exit $rc
