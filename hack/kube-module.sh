#!/usr/bin/env bash
# Prints the go.mod of a throwaway module that builds commands of k8s.io/kubernetes at
# VERSION, with every "k8s.io/x => ./staging/src/k8s.io/x" of its go.mod (KMOD, as
# `go mod download -json` gives it) replaced by the published version of that module:
# the staging directories are not part of the published k8s.io/kubernetes module.
# hack/envtest.sh and hack/node.sh build with it.
#
# Usage: hack/kube-module.sh MODULE VERSION KMOD
set -euo pipefail
module=$1 version=$2 kmod=$3
echo "module $module"
echo
echo "go $(go env GOVERSION | sed 's/^go\([0-9]*\.[0-9]*\).*/\1/')"
echo
echo "require k8s.io/kubernetes v$version"
echo
sed -n 's#^[[:space:]]*\(replace[[:space:]]*\)\{0,1\}\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\2#p' "$kmod" |
  sort -u | while read -r m; do echo "replace $m => $m v0.${version#1.}"; done
