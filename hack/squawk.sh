#!/usr/bin/env bash
# squawk, the Postgres migration linter, pinned, from npm (its binary ships in a
# platform package; no install scripts run).
#
#   hack/squawk.sh [install]   install it once per version into a per-user cache outside
#                              the clone; prints the binary's path last
#   hack/squawk.sh lint        lint every service's migrations (git ls-files
#                              '*/migrations/*.sql', new files too, test data aside)
#                              with .squawk.toml: what make lint runs
#
# goose runs each migration file as one transaction unless it says
# "-- +goose NO TRANSACTION"; squawk cannot read that, so each file is linted as goose
# runs it: with --assume-in-transaction or without.
set -euo pipefail

SQUAWK_VERSION=${SQUAWK_VERSION:-2.66.0}
here=$(cd "$(dirname "$0")/.." && pwd)
cache_root=${FLYTE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flyte-executor}
dir="$cache_root/squawk/$SQUAWK_VERSION"

log() { printf 'squawk.sh: %s\n' "$*" >&2; }

binary() {
  local b
  for b in "$dir"/node_modules/@squawk-cli/*/bin/squawk; do
    if [[ -x "$b" ]]; then
      echo "$b"
      return
    fi
  done
  return 1
}

install() {
  if binary 2>/dev/null; then
    return
  fi
  mkdir -p "$dir"
  # One installer at a time; a second caller waits and then finds the binary.
  exec 9>"$dir/.lock"
  flock 9
  if binary 2>/dev/null; then
    return
  fi
  if ! command -v npm >/dev/null; then
    if [[ $(id -u) == 0 ]]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
    else
      log "npm is missing (apt-get install npm)"
      exit 1
    fi
  fi
  log "installing squawk-cli@$SQUAWK_VERSION into $dir"
  npm install --prefix "$dir" --ignore-scripts --no-audit --no-fund --loglevel=error "squawk-cli@$SQUAWK_VERSION" >&2
  if ! binary; then
    log "squawk-cli@$SQUAWK_VERSION has no binary for this platform ($(uname -sm))"
    exit 1
  fi
}

lint() {
  local squawk
  squawk=$(install | tail -1)
  cd "$here"
  local in_tx=() no_tx=() f
  while IFS= read -r f; do
    if grep -q '^-- +goose NO TRANSACTION' "$f"; then no_tx+=("$f"); else in_tx+=("$f"); fi
  done < <(git ls-files --cached --others --exclude-standard '*/migrations/*.sql' | grep -v '/testdata/')
  local failed=0
  if ((${#in_tx[@]})); then
    "$squawk" --config=.squawk.toml --reporter=gcc --assume-in-transaction "${in_tx[@]}" || failed=1
  fi
  if ((${#no_tx[@]})); then
    "$squawk" --config=.squawk.toml --reporter=gcc --no-assume-in-transaction "${no_tx[@]}" || failed=1
  fi
  if ((failed)); then
    log "migrations fail the linter: see https://squawkhq.com/docs/rules; a contract migration that must drop what older code used says so with '-- squawk-ignore RULE' before the statement"
    exit 1
  fi
  log "$(( ${#in_tx[@]} + ${#no_tx[@]} )) migration files pass"
}

case "${1:-install}" in
  install) install ;;
  lint) lint ;;
  *) log "usage: $0 [install|lint]"; exit 2 ;;
esac
