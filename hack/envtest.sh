#!/usr/bin/env bash
# Builds the control-plane binaries envtest needs (kube-apiserver and etcd), and kubectl
# (which tests run as users do: kubectl wait), from the Go module proxy, once per version, into a per-user cache outside the clone, and prints the
# KUBEBUILDER_ASSETS directory as its last line.
#
# No binary downloads work on the machines we build on, so kube-apiserver is compiled from
# the k8s.io/kubernetes module in a throwaway module that replaces every k8s.io staging
# module with its published version (k8s.io/kubernetes itself points them at ./staging,
# which is not part of the published module). etcd is compiled at the version that
# k8s.io/kubernetes itself requires.
#
# Usage: hack/envtest.sh            build if needed, print the assets directory
#        hack/envtest.sh check      exit 0 if they are built, 1 if not (builds nothing)
#        K8S_VERSION=1.37.2 hack/envtest.sh
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)

# The Kubernetes version follows client-go in go.mod (v0.X.Y <-> v1.X.Y).
if [[ -z "${K8S_VERSION:-}" && -f "$here/go.mod" ]]; then
  cg=$(cd "$here" && GOWORK=off go list -m -f '{{.Version}}' k8s.io/client-go)
  [[ -n "$cg" ]] && K8S_VERSION="1.${cg#v0.}"
fi
K8S_VERSION=${K8S_VERSION:-1.37.2}

cache_root=${FLYTE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flyte-executor}
assets="$cache_root/envtest/k8s-$K8S_VERSION"
mkdir -p "$assets"

log() { printf 'envtest.sh: %s\n' "$*" >&2; }
# shellcheck source=hack/progress.sh
source "$here/hack/progress.sh"

built() { [[ -x "$assets/kube-apiserver" && -x "$assets/etcd" && -x "$assets/kubectl" ]]; }
# "check" only says, by its status, whether they are built.
if [[ "${1:-}" == check ]]; then
  built
  exit
fi
if built; then
  echo "$assets"
  exit 0
fi

# One builder at a time; a second caller waits and then finds the binaries.
exec 9>"$assets/.lock"
flock 9
if built; then
  echo "$assets"
  exit 0
fi

export GOFLAGS=-mod=mod GOWORK=off GOTOOLCHAIN=${GOTOOLCHAIN:-local}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

log "building what is missing of kube-apiserver, etcd and kubectl v$K8S_VERSION from source into $assets, once: 5 to 6 min on 2 cores the first time; later runs reuse them"
kmod=$(cd "$work" && go list -m -f '{{.GoMod}}' "k8s.io/kubernetes@v$K8S_VERSION")
[[ -f "$kmod" ]] || { log "could not download k8s.io/kubernetes@v$K8S_VERSION"; exit 1; }

if [[ ! -x "$assets/kube-apiserver" ]]; then
  mkdir -p "$work/apiserver"
  "$here/hack/kube-module.sh" envtestbuild/apiserver "$K8S_VERSION" "$kmod" >"$work/apiserver/go.mod"
  cat >"$work/apiserver/tools.go" <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
  long "downloading kube-apiserver's modules" "under a minute" quietly "$work/tidy.log" bash -c "cd '$work/apiserver' && go mod tidy"
  minor=${K8S_VERSION#1.}; minor=${minor%%.*}
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  long "building kube-apiserver v$K8S_VERSION from source" "4 to 5 min" \
    bash -c "cd '$work/apiserver' && CGO_ENABLED=0 go build -trimpath -ldflags '$ldflags' -o '$assets/kube-apiserver.tmp' k8s.io/kubernetes/cmd/kube-apiserver"
  mv "$assets/kube-apiserver.tmp" "$assets/kube-apiserver"
fi

if [[ ! -x "$assets/etcd" ]]; then
  etcd_version=$(go mod edit -json "$kmod" | (cd "$here" && GOFLAGS= go run ./hack/jsontmpl \
    '{{range .Require}}{{if eq .Path "go.etcd.io/etcd/client/v3"}}{{.Version}}{{end}}{{end}}'))
  [[ -n "$etcd_version" ]] || { log "k8s.io/kubernetes does not name an etcd version"; exit 1; }
  mkdir -p "$work/etcd"
  printf 'module envtestbuild/etcd\n\ngo %s\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
    "$(go env GOVERSION | sed 's/^go\([0-9]*\.[0-9]*\).*/\1/')" "$etcd_version" >"$work/etcd/go.mod"
  cat >"$work/etcd/tools.go" <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  long "building etcd $etcd_version from source" "about 30 s" \
    quietly "$work/etcd.log" bash -c "cd '$work/etcd' && go mod tidy && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o '$assets/etcd.tmp' go.etcd.io/etcd/server/v3"
  mv "$assets/etcd.tmp" "$assets/etcd"
fi

if [[ ! -x "$assets/kubectl" ]]; then
  mkdir -p "$work/kubectl"
  "$here/hack/kube-module.sh" envtestbuild/kubectl "$K8S_VERSION" "$kmod" >"$work/kubectl/go.mod"
  cat >"$work/kubectl/tools.go" <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kubectl"
GO
  minor=${K8S_VERSION#1.}; minor=${minor%%.*}
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  long "building kubectl v$K8S_VERSION from source" "about 30 s" \
    quietly "$work/kubectl.log" bash -c "cd '$work/kubectl' && go mod tidy && CGO_ENABLED=0 go build -trimpath -ldflags '$ldflags' -o '$assets/kubectl.tmp' k8s.io/kubernetes/cmd/kubectl"
  mv "$assets/kubectl.tmp" "$assets/kubectl"
fi

log "built kube-apiserver, etcd and kubectl in $(( $(date +%s) - start ))s, into $assets; later runs reuse them"
echo "$assets"
