#!/usr/bin/env bash
# A real Jaeger for tests and local runs: the all-in-one program built from the Go module
# proxy, in-memory storage, every port on 127.0.0.1.
#
#   hack/jaeger.sh [build]        build the binary once per version into a per-user cache
#                                 outside the clone; prints its path last
#   hack/jaeger.sh start DIR      start Jaeger in the background with its config, log
#                                 (jaeger.log) and pid (jaeger.pid) in DIR; waits until it
#                                 has started every listener and prints the query URL last
#   hack/jaeger.sh stop DIR       stop it (DIR is kept)
#
# Ports (all on 127.0.0.1) come from the environment:
#   JAEGER_OTLP_GRPC_PORT (4317)  JAEGER_OTLP_HTTP_PORT (4318)
#   JAEGER_QUERY_PORT (16686)     JAEGER_QUERY_GRPC_PORT (16685)
#   JAEGER_HEALTH_PORT (13133)    JAEGER_METRICS_PORT (8888, Jaeger's own Prometheus metrics)
# A port of 0 lets Jaeger take any free one; the log (JSON lines) gives each listener's
# address as bound, which test/jaegertest reads.
#
# No binary downloads work on the machines we build on, and `go install` refuses
# github.com/jaegertracing/jaeger/cmd/jaeger because Jaeger's go.mod has replace
# directives, so it is compiled in a throwaway module that repeats them. A module-proxy
# build carries no UI assets: the HTTP API (/api/services, /api/traces) works, the UI
# shows a placeholder.
set -euo pipefail

JAEGER_VERSION=${JAEGER_VERSION:-v1.76.0}
here=$(cd "$(dirname "$0")/.." && pwd)
cache_root=${FLYTE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flyte-executor}
bin_dir="$cache_root/jaeger/$JAEGER_VERSION"
binary="$bin_dir/jaeger"

log() { printf 'jaeger.sh: %s\n' "$*" >&2; }
# shellcheck source=hack/progress.sh
source "$here/hack/progress.sh"

build() {
  if [[ -x "$binary" ]]; then
    echo "$binary"
    return
  fi
  mkdir -p "$bin_dir"
  # One builder at a time; a second caller waits and then finds the binary.
  exec 9>"$bin_dir/.lock"
  flock 9
  if [[ -x "$binary" ]]; then
    echo "$binary"
    return
  fi

  export GOFLAGS=-mod=mod GOWORK=off GOTOOLCHAIN=${GOTOOLCHAIN:-local}
  local work start jmod
  work=$(mktemp -d)
  # shellcheck disable=SC2064 # expand $work now: it is local
  trap "rm -rf '$work'" EXIT
  start=$(date +%s)

  log "fetching github.com/jaegertracing/jaeger@$JAEGER_VERSION go.mod"
  jmod=$(cd "$work" && go list -m -f '{{.GoMod}}' "github.com/jaegertracing/jaeger@$JAEGER_VERSION") || true
  if [[ ! -f "$jmod" ]]; then
    log "could not download github.com/jaegertracing/jaeger@$JAEGER_VERSION (is the Go module proxy reachable?)"
    exit 1
  fi

  {
    echo "module jaegerbuild"
    echo
    echo "go $(go env GOVERSION | sed 's/^go\([0-9]*\.[0-9]*\).*/\1/')"
    echo
    echo "require github.com/jaegertracing/jaeger $JAEGER_VERSION"
    echo
    # Repeat every replace of Jaeger's go.mod; a replace to a local directory cannot be
    # repeated and would fail the build below.
    local replace='replace {{.Old.Path}}{{with .Old.Version}} {{.}}{{end}} => {{.New.Path}}{{with .New.Version}} {{.}}{{end}}'
    go mod edit -json "$jmod" | (cd "$here" && GOFLAGS= go run ./hack/jsontmpl "{{range .Replace}}$replace{{\"\n\"}}{{end}}")
  } >"$work/go.mod"
  cat >"$work/tools.go" <<'GO'
//go:build tools

package tools

import _ "github.com/jaegertracing/jaeger/cmd/jaeger"
GO
  long "downloading Jaeger's modules" "under a minute" quietly "$work/tidy.log" bash -c "cd '$work' && go mod tidy"
  local vpkg=github.com/jaegertracing/jaeger/internal/version
  long "building Jaeger $JAEGER_VERSION from source" "3 to 4.5 min" \
    bash -c "cd '$work' && CGO_ENABLED=0 go build -trimpath \
      -ldflags '-s -w -X $vpkg.latestVersion=$JAEGER_VERSION -X $vpkg.date=$(date -u +%Y-%m-%dT%H:%M:%SZ)' \
      -o '$binary.tmp' github.com/jaegertracing/jaeger/cmd/jaeger"
  mv "$binary.tmp" "$binary"
  log "built in $(($(date +%s) - start))s, into $binary; later runs reuse it"
  echo "$binary"
}

# write_config writes a config with every listener on 127.0.0.1: Jaeger's defaults bind
# the query ports to all interfaces. It keeps only what our code talks to (OTLP in, the
# query API out, health and metrics), not the Jaeger/Zipkin receivers, remote sampling,
# expvar or zpages of Jaeger's all-in-one config, so there are fewer ports to collide.
write_config() {
  cat >"$1" <<YAML
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: basic
      readers:
        - pull:
            exporter:
              prometheus:
                host: 127.0.0.1
                port: ${JAEGER_METRICS_PORT:-8888}
    logs:
      level: info
      encoding: json

extensions:
  jaeger_query:
    storage:
      traces: memstore
    # On by default in v2: Jaeger would trace its own queries and send them over OTLP to
    # the default endpoint (localhost:4317), which is not ours when the ports are moved.
    enable_tracing: false
    http:
      endpoint: 127.0.0.1:${JAEGER_QUERY_PORT:-16686}
    grpc:
      endpoint: 127.0.0.1:${JAEGER_QUERY_GRPC_PORT:-16685}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:${JAEGER_HEALTH_PORT:-13133}

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:${JAEGER_OTLP_GRPC_PORT:-4317}
      http:
        endpoint: 127.0.0.1:${JAEGER_OTLP_HTTP_PORT:-4318}

processors:
  batch:

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
YAML
}

running() { [[ -f "$1/jaeger.pid" ]] && kill -0 "$(cat "$1/jaeger.pid")" 2>/dev/null; }

start() {
  local dir=${1:?usage: hack/jaeger.sh start DIR}
  local bin query pid
  bin=$(build)
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if running "$dir"; then
    log "already running in $dir (pid $(cat "$dir/jaeger.pid"))"
    exit 1
  fi
  write_config "$dir/config.yaml"
  # setsid: its own session, so the caller's Ctrl-C or process group kill leaves it to stop.
  setsid "$bin" --config "$dir/config.yaml" >"$dir/jaeger.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/jaeger.pid"
  # Ready when the collector says every component has started: each listener is bound by
  # then. A port someone else holds makes it exit instead, which the log tail shows.
  for _ in $(seq 1 300); do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$dir/jaeger.log" >&2
      log "jaeger exited during startup (a port in use? see the JAEGER_*_PORT variables); log in $dir/jaeger.log"
      rm -f "$dir/jaeger.pid"
      exit 1
    fi
    if grep -q '"msg":"Everything is ready' "$dir/jaeger.log"; then
      query=${JAEGER_QUERY_PORT:-16686}
      if [[ $query == 0 ]]; then
        echo "see $dir/jaeger.log for the addresses"
      else
        echo "http://127.0.0.1:$query"
      fi
      return
    fi
    sleep 0.1
  done
  kill "$pid" 2>/dev/null || true
  rm -f "$dir/jaeger.pid"
  tail -n 30 "$dir/jaeger.log" >&2
  log "jaeger did not start within 30s"
  exit 1
}

stop() {
  local dir=${1:?usage: hack/jaeger.sh stop DIR}
  running "$dir" || { rm -f "$dir/jaeger.pid"; return; }
  local pid
  pid=$(cat "$dir/jaeger.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$dir/jaeger.pid"; return; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$dir/jaeger.pid"
}

case "${1:-build}" in
  build) build ;;
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  *) echo "usage: hack/jaeger.sh [build] | start DIR | stop DIR" >&2; exit 2 ;;
esac
