#!/usr/bin/env bash
# A throwaway Postgres cluster for tests and local runs, from Debian's binaries.
#
#   hack/postgres.sh start [DIR]   start a cluster in DIR (default: a new temp dir) on a
#                                  free port on 127.0.0.1; prints "DIR" then the URL last
#   hack/postgres.sh stop DIR      stop it and remove DIR
#   hack/postgres.sh pause DIR     stop the server, keeping its data (for outage tests)
#   hack/postgres.sh resume DIR    start it again on the same port
#
# When TEST_DATABASE_URL is set, start prints it and starts nothing. The cluster trades
# durability for speed (fsync=off): it is for tests only. As root, Postgres is installed
# with apt-get when missing, and the cluster runs as the postgres user (initdb refuses root).
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

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# run_server starts the cluster in $1 on port $2.
run_server() {
  as_owner "$(pg_bin)/pg_ctl" -D "$1/data" -l "$1/postgres.log" -w -t 30 start -o \
    "-p $2 -c listen_addresses=127.0.0.1 -c unix_socket_directories=$1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" >/dev/null
}

start() {
  if [[ -n "${TEST_DATABASE_URL:-}" ]]; then
    echo "-"
    echo "$TEST_DATABASE_URL"
    return
  fi
  local bin dir port
  bin=$(pg_bin)
  dir=${1:-$(mktemp -d -t flyte-pg.XXXXXX)}
  mkdir -p "$dir"
  [[ $(id -u) -eq 0 ]] && chown postgres: "$dir"
  as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; exit 1; }
  for _ in $(seq 1 20); do
    port=$((20000 + RANDOM % 40000))
    port_free "$port" || continue
    if run_server "$dir" "$port"; then
      echo "$port" >"$dir/port"
      echo "$dir"
      echo "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
      return
    fi
  done
  cat "$dir/postgres.log" >&2
  log "could not start Postgres"
  exit 1
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
  run_server "$dir" "$(cat "$dir/port")"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  pause) shift; pause "$@" ;;
  resume) shift; resume "$@" ;;
  *) echo "usage: hack/postgres.sh start [DIR] | stop DIR | pause DIR | resume DIR" >&2; exit 2 ;;
esac
