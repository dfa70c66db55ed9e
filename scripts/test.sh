#!/usr/bin/env bash
# `make test`: a private data dir and Redis on a free port, Django's checks, ruff,
# then pytest twice: every test on SQLite (a whole run: the Slurm and browser tests in
# one lane, the rest in another beside it), then the tests that use the database on a
# private PostgreSQL (its own data dir and port); afterwards stop every process the
# tests left under the data dir. The SQLite pass gets Slurm accounting: a private
# MariaDB + slurmdbd (mtc/accounting.py) that every test cluster registers with
# (MTC_TEST_ACCOUNTING=0: none, clusters run without accounting).
# MTC_TEST_PASSES=sqlite or =postgres runs one pass alone (default: sqlite,postgres).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
PASSES=${MTC_TEST_PASSES:-sqlite,postgres}
for pass in ${PASSES//,/ }; do
  [[ $pass == sqlite || $pass == postgres ]] || {
    echo "test: MTC_TEST_PASSES takes sqlite and/or postgres, not '$pass'"; exit 2; }
done

TEST_TMP=$(mktemp -d /tmp/mtc-test.XXXXXX)
# Jobs run as their owners' accounts: they pass through (never list) the run's dir.
chmod 0711 "$TEST_TMP"
# Each run makes its Unix accounts in its own block of 300 uids, so runs side by side
# never share one; the SQLite pass's Slurm lane takes the first 120, its database lane
# the next 90, the PostgreSQL pass the last 90 (none adopts another's accounts);
# cleanup removes the whole block.
UID_BLOCK=$(( 30000 + ( $(printf '%s' "$TEST_TMP" | cksum | cut -d' ' -f1) % 100 ) * 300 ))
UID_BLOCK_END=$((UID_BLOCK + 299))
export MTC_UID_RANGE="$UID_BLOCK-$((UID_BLOCK + 119))"
DB_LANE_UID_RANGE="$((UID_BLOCK + 120))-$((UID_BLOCK + 209))"
PG_UID_RANGE="$((UID_BLOCK + 210))-$UID_BLOCK_END"
export MTC_DATA_DIR="$TEST_TMP/data"
export MTC_CELERY_EAGER=1
# This run's nftables table (mtc/firewall.py): its uid block kept off its Redis, MariaDB
# and PostgreSQL, and off the web servers tests start (mtc.devstack adds their ports).
export MTC_FIREWALL="mtc_t$(printf '%s' "$TEST_TMP" | cksum | cut -d' ' -f1)"
# Tests run node checks on demand; agent daemons on every test node would only
# compete for the two cores.
export MTC_LOCAL_NODE_AGENTS=0
# The fabric check on create and on repair costs ~20 s a cluster; its own tests turn it on.
export MTC_FABRIC_CHECK_ON_CREATE=0 MTC_FABRIC_CHECK_ON_REPAIR=0
mkdir -p "$MTC_DATA_DIR"
REDIS_PORT=$($PY -c 'from mtc.devstack import free_port; print(free_port())')
# Its own password (mtc/redisauth.py: the default user off), in a 0600 config file: jobs
# run on this host as other accounts, and a job must not use Redis.
REDIS_URL=$($PY -m mtc.redisauth config "$TEST_TMP/redis.conf" "$REDIS_PORT" "$TEST_TMP")
export REDIS_URL
redis-server "$TEST_TMP/redis.conf" >"$TEST_TMP/redis.log" 2>&1 &
REDIS_PID=$!

PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
PG_DIR="$TEST_TMP/pg"
PG_STARTED=""
IMAGE_PID=""
PG_PID=""
DB_LANE_PID=""
# initdb's superuser: the account its commands run as, so peer auth lets them in.
PG_SUPER=postgres
((EUID == 0)) || PG_SUPER=$(id -un)
# PostgreSQL refuses to run as root: as root its commands run as the postgres account,
# from its own dir (it may not enter the checkout).
as_pg() {
  if ((EUID == 0)); then
    (cd "$PG_DIR" && setpriv --reuid=postgres --regid=postgres --init-groups -- "$@")
  else
    (cd "$PG_DIR" && "$@")
  fi
}

# A private PostgreSQL: initdb into the run's dir, 127.0.0.1 on a free port, durability
# off (the data lives for one run). Sets PG_URL to a fresh role's database.
pg_start() {
  [[ -x $PG_BIN/initdb ]] || { echo "test: PostgreSQL is not installed (make setup)" >&2; return 1; }
  mkdir -m 0700 "$PG_DIR" || return 1
  if ((EUID == 0)); then chown postgres:postgres "$PG_DIR" || return 1; fi
  local port password
  port=$($PY -c 'from mtc.devstack import free_port; print(free_port())')
  password=$($PY -c 'import secrets; print(secrets.token_hex(16))')
  as_pg "$PG_BIN/initdb" -D "$PG_DIR/data" -U "$PG_SUPER" -A peer --auth-host=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8 >"$PG_DIR/initdb.log" 2>&1 || {
    cat "$PG_DIR/initdb.log" >&2; return 1; }
  cat >>"$PG_DIR/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$PG_DIR'
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
  PG_STARTED=1
  # At a lower priority, like the pass that uses it (it may run beside the SQLite pass).
  as_pg nice -n 15 "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -s start || {
    cat "$PG_DIR/server.log" >&2; return 1; }
  # The role may create databases: pytest-django makes test_mtc beside mtc.
  as_pg "$PG_BIN/psql" -h "$PG_DIR" -p "$port" -U "$PG_SUPER" -d postgres -q -v ON_ERROR_STOP=1 \
    -c "CREATE ROLE mtc LOGIN CREATEDB PASSWORD '$password'" -c "CREATE DATABASE mtc OWNER mtc" \
    >&2 || return 1
  PG_URL="postgres://mtc:$password@127.0.0.1:$port/mtc"
  PG_PORT=$port
}

ACCT_DIR="$TEST_TMP/accounting"
ACCT_STARTED=""

cleanup() {
  # Under the main body's set -e one failed command here would skip the rest.
  set +e
  kill "$REDIS_PID" 2>/dev/null
  # An interrupted run: the image tests' pytest (its fixture unmounts the chroot).
  [[ -n ${IMAGE_PID:-} ]] && kill "$IMAGE_PID" 2>/dev/null && wait "$IMAGE_PID"
  [[ -n ${PG_PID:-} ]] && pkill -P "$PG_PID" 2>/dev/null && wait "$PG_PID"
  [[ -n ${DB_LANE_PID:-} ]] && pkill -P "$DB_LANE_PID" 2>/dev/null && wait "$DB_LANE_PID"
  $PY -m mtc.firewall remove "$MTC_FIREWALL" >/dev/null 2>&1
  [[ -n $ACCT_STARTED ]] && $PY -m mtc.accounting stop "$ACCT_DIR"
  [[ -n $PG_STARTED ]] && as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" stop -m fast -s
  # Slurm daemons and job steps the tests started all mention the data dir.
  $PY - "$TEST_TMP" <<'PYEOF'
import sys
from clusters.providers import procs
left = procs.processes_mentioning(sys.argv[1])
if left:
    print(f"test: stopping {len(left)} leftover process(es)")
    procs.stop(left)
PYEOF
  getent passwd | awk -F: -v lo="$UID_BLOCK" -v hi="$UID_BLOCK_END" \
    '$3 >= lo && $3 <= hi {print $1}' | while read -r name; do
    userdel "$name" 2>/dev/null; groupdel "$name" 2>/dev/null
  done
  rm -rf "$TEST_TMP"
}
trap cleanup EXIT

for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping 2>&1 | grep -q -e PONG -e NOAUTH && break; sleep 0.1; done

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
set +e
rc=0
if [[ ,$PASSES, == *,sqlite,* && ${MTC_TEST_ACCOUNTING:-1} != 0 ]]; then
  echo "== accounting (MariaDB + slurmdbd)"
  MTC_SLURMDBD_PORT=$($PY -c 'from mtc.devstack import free_port; print(free_port())')
  ACCT_STARTED=1
  $PY -m mtc.accounting start "$ACCT_DIR" "$MTC_SLURMDBD_PORT" || {
    echo "test: accounting did not start (MTC_TEST_ACCOUNTING=0 runs without it)"; exit 1; }
  export MTC_SLURMDBD_PORT MTC_ACCOUNTING_DIR=$ACCT_DIR
fi
# The PostgreSQL pass: only the tests that use the database (tests/conftest.py); Slurm
# and browser tests run in the SQLite pass. A -m in the arguments comes later and
# replaces this one. Its own data dir too (homes and cluster dirs of the first pass
# belong to its accounts) and its own Redis database (the polls' overlap locks are
# Redis keys: the passes may run side by side).
pg_pass() {
  mkdir -p "$TEST_TMP/data-pg"
  DATABASE_URL=$PG_URL MTC_TEST_DB_ONLY=1 MTC_UID_RANGE=$PG_UID_RANGE \
    MTC_DATA_DIR="$TEST_TMP/data-pg" REDIS_URL="${REDIS_URL%/*}/1" MTC_TEST_LANE=postgres \
    $PY -m pytest -m "not slurm and not browser" "$@"
}
# A whole run's SQLite pass runs in two lanes side by side: the Slurm and browser tests
# (93 of ~990, ~16 minutes mostly spent waiting on daemons and jobs) and every other test
# (CPU-bound, ~7 minutes), which gets its own data dir (so its own SQLite test database),
# Redis database and uids, as the PostgreSQL pass does.
db_lane() {
  mkdir -p "$TEST_TMP/data-db"
  MTC_UID_RANGE=$DB_LANE_UID_RANGE MTC_DATA_DIR="$TEST_TMP/data-db" \
    REDIS_URL="${REDIS_URL%/*}/2" MTC_TEST_LANE=db \
    $PY -m pytest -m "not slurm and not browser and not image" "$@"
}
pg_rc_merge() {
  if (($1 == 5)); then
    echo "test: none of these tests use the database"  # nothing to repeat on PostgreSQL
  elif (($1 != 0 && rc == 0)); then
    rc=$1
  fi
}
if [[ ,$PASSES, == *,postgres,* ]]; then
  PG_URL=""
  if ! pg_start; then
    echo "test: the private PostgreSQL did not start"
    exit 1
  fi
fi
FIREWALL_PORTS=("$REDIS_PORT")
[[ -n ${PG_PORT:-} ]] && FIREWALL_PORTS+=("$PG_PORT")
[[ -f $ACCT_DIR/run/mariadb.port ]] && FIREWALL_PORTS+=("$(cat "$ACCT_DIR/run/mariadb.port")")
$PY -m mtc.firewall apply "$MTC_FIREWALL" "$UID_BLOCK-$UID_BLOCK_END" "${FIREWALL_PORTS[@]}"
if [[ ,$PASSES, == *,sqlite,* ]]; then
  if (($# == 0)); then
    # A whole run: the node image's chroot tests (marker image: apt and pip in a Debian
    # 12 chroot, minutes mostly spent waiting on downloads and disk), the SQLite pass's
    # database lane and the PostgreSQL pass (CPU-bound, no Slurm) run beside the Slurm
    # lane, at a lower priority: the Slurm tests spend much of their time waiting, and
    # the timing-sensitive ones (stragglers, fabric, speed checks) keep the CPU when they
    # need it.
    nice -n 10 $PY -m pytest -q -m image tests/test_gce_image.py >"$TEST_TMP/image-tests.log" 2>&1 &
    IMAGE_PID=$!
    if [[ ,$PASSES, == *,postgres,* ]]; then
      (renice -n 15 -p $BASHPID >/dev/null; pg_pass -q -p no:cacheprovider) \
        >"$TEST_TMP/pg-tests.log" 2>&1 &
      PG_PID=$!
    fi
    (renice -n 10 -p $BASHPID >/dev/null; db_lane -q --durations=5) \
      >"$TEST_TMP/db-lane-tests.log" 2>&1 &
    DB_LANE_PID=$!
    echo "== pytest (SQLite: Slurm and browser tests)"
    # The slowest tests named at the end: where the suite's time goes, run by run.
    $PY -m pytest -m "(slurm or browser) and not image" --durations=20 || rc=$?
    wait "$DB_LANE_PID"
    db_rc=$?
    DB_LANE_PID=""
    echo "== pytest (SQLite: every other test, beside the Slurm tests)"
    cat "$TEST_TMP/db-lane-tests.log"
    if ((db_rc != 0 && rc == 0)); then rc=$db_rc; fi
    wait "$IMAGE_PID"
    image_rc=$?
    IMAGE_PID=""
    echo "== pytest -m image (beside the SQLite pass)"
    cat "$TEST_TMP/image-tests.log"
    if ((image_rc != 0 && image_rc != 5 && rc == 0)); then rc=$image_rc; fi
    if [[ -n ${PG_PID:-} ]]; then
      wait "$PG_PID"
      pg_rc=$?
      PG_PID=""
      echo "== pytest (PostgreSQL, beside the SQLite pass)"
      cat "$TEST_TMP/pg-tests.log"
      pg_rc_merge "$pg_rc"
      exit $rc
    fi
  else
    echo "== pytest (SQLite)"
    $PY -m pytest "$@" || rc=$?
  fi
fi
if [[ ,$PASSES, == *,postgres,* ]]; then
  echo "== pytest (PostgreSQL)"
  pg_pass "$@"
  pg_rc_merge $?
fi
exit $rc
