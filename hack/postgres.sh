#!/usr/bin/env bash
# A throwaway Postgres cluster for tests and local runs, from Debian's binaries.
#
#   hack/postgres.sh start [DIR]   start a cluster in DIR (default: a new temp dir); prints
#                                  "DIR" then the URL last
#   hack/postgres.sh stop DIR      stop it and remove DIR
#   hack/postgres.sh pause DIR     stop the server, keeping its data (for outage tests)
#   hack/postgres.sh resume DIR    start it again at the same address
#
# The cluster listens on a Unix socket in DIR and on no TCP port (unless FLYTE_PG_TCP_PORT
# says, below), so there is no port to choose and none to collide with another cluster or
# program; the URL names DIR as its host (pgx and psql take it as is), and DIR's path must
# stay short (a socket's path holds at most 107 bytes). When TEST_DATABASE_URL is set, start prints it and starts nothing.
# The cluster trades durability for speed (fsync=off): it is for tests only. As root,
# Postgres is installed with apt-get when missing, and the cluster runs as the postgres
# user (initdb refuses root).
set -euo pipefail

log() { printf 'postgres.sh: %s\n' "$*" >&2; }

pg_bin() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  if [[ -z "$bin" ]]; then
    if [[ $(id -u) -ne 0 ]]; then
      log "Postgres is not installed; run: sudo apt-get install -y postgresql"
      exit 1
    fi
    log "installing postgresql with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2 ||
      { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2; }
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  fi
  echo "$bin"
}

# as_owner runs a command as the cluster's owner: ourselves, or postgres when we are root.
as_owner() {
  if [[ $(id -u) -eq 0 ]]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# run_server starts the cluster in $1, listening on $1/.s.PGSQL.5432 only. The port is
# named, although no TCP socket uses it, because it names the socket file and a PGPORT in
# the environment would otherwise change it.
# With FLYTE_PG_DURABLE=1 a commit waits for its WAL to reach the operating system
# (synchronous_commit=on), so that a server killed at once (pg_ctl -m immediate, as the
# chaos soak does) loses nothing it acknowledged; fsync stays off, which only an
# operating system crash would notice. With FLYTE_PG_DURABLE=full, fsync and full page
# writes are on too, as on a deployment (benchmarks of what a commit costs).
# FLYTE_PG_TCP_PORT, at start, makes the server listen on 127.0.0.1 at that port too,
# besides its socket, for clients in another mount namespace (deploy-node's pods); the
# port is kept in DIR so that resume listens there again.
port() { if [[ -f "$1/tcp-port" ]]; then cat "$1/tcp-port"; else echo 5432; fi; }
listen() { if [[ -f "$1/tcp-port" ]]; then echo 127.0.0.1; fi; }

run_server() {
  local commit=off fsync=off
  [[ "${FLYTE_PG_DURABLE:-}" == 1 ]] && commit=on
  [[ "${FLYTE_PG_DURABLE:-}" == full ]] && commit=on fsync=on
  as_owner "$(pg_bin)/pg_ctl" -D "$1/data" -l "$1/postgres.log" -w -t 30 start -o \
    "-p $(port "$1") -c listen_addresses=$(listen "$1") -c unix_socket_directories=$1 -c fsync=$fsync -c synchronous_commit=$commit -c full_page_writes=$fsync -c max_connections=300" >/dev/null
}

start() {
  if [[ -n "${TEST_DATABASE_URL:-}" ]]; then
    echo "-"
    echo "$TEST_DATABASE_URL"
    return
  fi
  local bin dir
  bin=$(pg_bin)
  dir=${1:-$(mktemp -d -t flyte-pg.XXXXXX)}
  mkdir -p "$dir"
  [[ $(id -u) -eq 0 ]] && chown postgres: "$dir"
  [[ -n "${FLYTE_PG_TCP_PORT:-}" ]] && echo "$FLYTE_PG_TCP_PORT" >"$dir/tcp-port"
  as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; exit 1; }
  if ! run_server "$dir"; then
    cat "$dir/postgres.log" >&2
    log "could not start Postgres"
    exit 1
  fi
  echo "$dir"
  if [[ -n "${FLYTE_PG_TCP_PORT:-}" ]]; then
    echo "postgres://postgres@127.0.0.1:$FLYTE_PG_TCP_PORT/postgres?sslmode=disable"
  else
    echo "postgres://postgres@/postgres?host=$dir&port=5432&sslmode=disable"
  fi
}

stop() {
  local dir=${1:?usage: hack/postgres.sh stop DIR}
  [[ "$dir" == "-" ]] && return
  if [[ -d "$dir/data" ]]; then
    as_owner "$(pg_bin)/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
}

pause() {
  local dir=${1:?usage: hack/postgres.sh pause DIR}
  as_owner "$(pg_bin)/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
}

resume() {
  local dir=${1:?usage: hack/postgres.sh resume DIR}
  run_server "$dir"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  pause) shift; pause "$@" ;;
  resume) shift; resume "$@" ;;
  *) echo "usage: hack/postgres.sh start [DIR] | stop DIR | pause DIR | resume DIR" >&2; exit 2 ;;
esac
