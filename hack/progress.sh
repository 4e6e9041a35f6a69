# Sourced by the scripts that build on a first run (envtest.sh, node.sh, jaeger.sh), so
# that none of their long steps leaves a terminal silent, or flooded, for minutes.
#
#   long WHAT FIRST-TIME COMMAND...
#       says WHAT is being done and how long it takes the first time (FIRST-TIME, measured
#       by hack/first-run.sh: README.md, "The first run"), then a line every
#       PROGRESS_EVERY seconds (60) with the time so far while COMMAND runs, and, if it
#       took that long, the time it took. COMMAND's status is long's.
#   quietly LOG COMMAND...
#       runs COMMAND with its output in LOG (go's "downloading" lines, hundreds on a first
#       run), and shows LOG's end only if COMMAND fails.
#
# Lines go to stderr, prefixed with the caller's name.

progress_name=${progress_name:-$(basename "$0")}

long() {
  local what=$1 first=$2
  shift 2
  local start every=${PROGRESS_EVERY:-60} beat rc=0
  start=$(date +%s)
  printf '%s: %s (%s the first time)\n' "$progress_name" "$what" "$first" >&2
  (
    # The sleep runs in the background so that TERM ends the beat at once.
    nap=
    trap 'kill $nap 2>/dev/null; exit 0' TERM
    while :; do
      sleep "$every" &
      nap=$!
      wait "$nap"
      printf '%s:   still %s: %ss so far\n' "$progress_name" "$what" "$(($(date +%s) - start))" >&2
    done
  ) &
  beat=$!
  "$@" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  if ((rc == 0 && $(date +%s) - start >= every)); then
    printf '%s:   %s: done in %ss\n' "$progress_name" "$what" "$(($(date +%s) - start))" >&2
  fi
  return "$rc"
}

quietly() {
  local log=$1 rc=0
  shift
  "$@" >"$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    printf '%s: %s failed (%s); the end of its output:\n' "$progress_name" "$*" "$rc" >&2
    tail -n 40 "$log" >&2
  fi
  return "$rc"
}
