#!/usr/bin/env bash
# Times `make run` as a newcomer meets it: a fresh clone of HEAD, run until its examples
# settle (RUN_FLAGS=--until-settled), every line it prints prefixed with the seconds since
# the start, so that each step's time can be read off. The README's table of first-run
# times comes from it.
#
# Usage: hack/first-run.sh LOG              with the caches this environment names (on a
#                                           new machine they are empty: a cold run)
#        COLD=DIR hack/first-run.sh LOG     with empty Go build and module caches and an
#                                           empty FLYTE_CACHE_DIR under DIR (which must not
#                                           exist): a cold run on a machine already used
#
# What it cannot empty is said in the log's first lines: Debian's packages (containerd,
# Postgres) stay installed once a run has installed them.
set -euo pipefail

log=${1:?usage: hack/first-run.sh LOG}
here=$(cd "$(dirname "$0")/.." && pwd)
if [[ -n "${COLD:-}" ]]; then
  [[ ! -e "$COLD" ]] || { echo "first-run.sh: $COLD exists; COLD names a directory to create" >&2; exit 1; }
  export GOCACHE="$COLD/go-build" GOMODCACHE="$COLD/go-mod" FLYTE_CACHE_DIR="$COLD/flyte-executor"
fi
clone=$(mktemp -d)
trap 'chmod -R u+w "$clone" 2>/dev/null; rm -rf "$clone"' EXIT
git clone -q "$here" "$clone/flyte-backend"

cache=${FLYTE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flyte-executor}
state() { if [[ -d "$1" ]] && [[ -n "$(ls -A "$1" 2>/dev/null)" ]]; then echo "in use"; else echo "empty"; fi; }
has() { if command -v "$1" >/dev/null || [[ -x "$2" ]]; then echo installed; else echo "not installed"; fi; }
{
  echo "first-run.sh: commit $(git -C "$here" rev-parse --short HEAD), $(nproc) cores, $(date -u +%FT%TZ), as $(id -un)"
  echo "first-run.sh: Go build cache $(go env GOCACHE): $(state "$(go env GOCACHE)")"
  echo "first-run.sh: Go module cache $(go env GOMODCACHE): $(state "$(go env GOMODCACHE)")"
  echo "first-run.sh: FLYTE_CACHE_DIR $cache: $(state "$cache")"
  echo "first-run.sh: containerd $(has containerd /usr/bin/containerd), Postgres $(has initdb "$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | head -1)")"
} | tee "$log"

start=$(date +%s)
set +e
(cd "$clone/flyte-backend" && make run RUN_FLAGS=--until-settled 2>&1) |
  while IFS= read -r line; do printf '%5ds %s\n' "$(( $(date +%s) - start ))" "$line"; done | tee -a "$log"
rc=${PIPESTATUS[0]}
end=$(( $(date +%s) - start ))
echo "first-run.sh: make run exited $rc after ${end}s" | tee -a "$log"
echo "first-run.sh: the steps that took a minute or more:" | tee -a "$log"
grep -E ': done in [0-9]+' "$log" | sed 's/^/  /' | tee -a "$log" || true
# What a newcomer should not have to read: a library's stack trace or warning (klog's
# "W1206 12:00:00.000000" lines), a Go panic.
if grep -nE '\[controller-runtime\]|goroutine [0-9]+ \[|panic: |^ *[0-9]+s [IWEF][0-9]{4} [0-9:.]+ ' "$log" >"$log.noise"; then
  tee -a "$log" <"$log.noise"
  echo "first-run.sh: the lines above are not the user's business" | tee -a "$log"
  rc=1
fi
rm -f "$log.noise"
exit "$rc"
