#!/usr/bin/env bash
# events-bench of two builds, alternating, ROUNDS times each, on one machine:
#   hack/events-bench-builds.sh BEFORE AFTER [events-bench flags...]
# Each build's events-bench is compiled from a worktree of its commit, with the
# benchmark's own code (bench/events) taken from AFTER, so that both measure Record
# against the same ceiling and only the service's code and migrations differ. The
# figures of docs/benchmarks.md, "The key with the cluster", came from
#   hack/events-bench-builds.sh 158b29b 1f76196 --compare-auth=false --compare-outbox=false \
#     --egress=false --batches 100,500 --rounds 3 --stored-events 1000 --queries 100
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 BEFORE AFTER [events-bench flags...]" >&2; exit 2; }
before=$1 after=$2
shift 2
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/before" 2>/dev/null; git -C "$root" worktree remove --force "$work/after" 2>/dev/null; rm -rf "$work"' EXIT
for which in before after; do
  git -C "$root" worktree add -q --detach "$work/$which" "${!which}"
  git -C "$work/$which" checkout -q "$after" -- bench/events
  (cd "$work/$which" && go build -o "$work/events-bench-$which" ./bench/cmd/events-bench)
done
for i in $(seq "${ROUNDS:-3}"); do
  for which in before after; do
    echo "=== $which (${!which}), run $i, $(date +%T)"
    (cd "$root" && "$work/events-bench-$which" "$@") | grep -E '^\|'
  done
done
