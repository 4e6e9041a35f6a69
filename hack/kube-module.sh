#!/usr/bin/env bash
# Prints the go.mod of a throwaway module that builds commands of k8s.io/kubernetes at
# VERSION, with every "k8s.io/x => ./staging/src/k8s.io/x" of its go.mod (KMOD, as
# `go list -m -f '{{.GoMod}}'` gives it) replaced by the published version of that module:
# the staging directories are not part of the published k8s.io/kubernetes module.
# hack/envtest.sh and hack/node.sh build with it.
#
# Usage: hack/kube-module.sh MODULE VERSION KMOD
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
module=$1 version=$2 kmod=$3
echo "module $module"
echo
echo "go $(go env GOVERSION | sed 's/^go\([0-9]*\.[0-9]*\).*/\1/')"
echo
echo "require k8s.io/kubernetes v$version"
echo
go mod edit -json "$kmod" |
  (cd "$here" && GOFLAGS= GOWORK=off go run ./hack/jsontmpl '{{range .Replace}}{{.Old.Path}} {{.New.Path}}{{"\n"}}{{end}}') |
  while read -r old new; do if [[ $old == k8s.io/* && $new == ./staging/* ]]; then echo "$old"; fi; done |
  sort -u | while read -r m; do echo "replace $m => $m v0.${version#1.}"; done
