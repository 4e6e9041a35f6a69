#!/usr/bin/env bash
# A single-node Kubernetes on loopback, built here: etcd and kube-apiserver (from
# hack/envtest.sh), kube-controller-manager, kube-scheduler and kubelet (built by this
# script from the Go module proxy into the same per-user cache), containerd and runc
# (Debian's packages, installed when missing).
#
# Everything listens on 127.0.0.1; pods get a network namespace of their own with a
# loopback-range address and no route out (hack/cni/isolated), or, with hostNetwork, the
# machine's, where the API server and Postgres are on 127.0.0.1 (deploy-node's pods);
# every registry containerd knows of, named or not, is a closed port on loopback
# (registry_port), so it pulls nothing: images are imported; the node reports 127.0.0.1
# as its address. Nothing of it sends traffic off the machine.
#
# Usage: hack/node.sh build        build the node's binaries if needed, print their directory
#        hack/node.sh install      install containerd, runc and the CNI plugins if missing (root)
#        hack/node.sh start DIR    start a node whose state lives in DIR; once it is Ready,
#                                  print the path of an admin kubeconfig as the last line
#        hack/node.sh images       the task images a started node holds, one a line, a
#                                  busybox image with sh first
#        hack/node.sh attach DIR KUBECONFIG
#                                  start containerd, a kubelet and kube-scheduler only, whose
#                                  state lives in DIR, as a node of the API server KUBECONFIG
#                                  reaches (an administrator's); print the node's name. It
#                                  does not wait for the node to be Ready: the caller does
#        hack/node.sh stop DIR     stop the node of DIR and remove what it left behind
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
log() { printf 'node.sh: %s\n' "$*" >&2; }
# shellcheck source=hack/progress.sh
source "$here/hack/progress.sh"

# build compiles kubelet, kube-scheduler and kube-controller-manager in one go build, so
# that they share the compile, at the Kubernetes version hack/envtest.sh builds.
build() {
  local assets
  assets=$("$here/hack/envtest.sh")
  local version=${assets##*/k8s-}
  local bins=$assets/node
  mkdir -p "$bins"
  if [[ -x "$bins/kubelet" && -x "$bins/kube-scheduler" && -x "$bins/kube-controller-manager" ]]; then
    echo "$bins"
    return
  fi
  exec 8>"$bins/.lock"
  flock 8
  if [[ -x "$bins/kubelet" && -x "$bins/kube-scheduler" && -x "$bins/kube-controller-manager" ]]; then
    echo "$bins"
    return
  fi
  export GOFLAGS=-mod=mod GOWORK=off GOTOOLCHAIN=${GOTOOLCHAIN:-local}
  local work start kmod minor ldflags
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  start=$(date +%s)
  kmod=$(cd "$work" && go list -m -f '{{.GoMod}}' "k8s.io/kubernetes@v$version")
  [[ -f "$kmod" ]] || { log "could not download k8s.io/kubernetes@v$version"; exit 1; }
  "$here/hack/kube-module.sh" nodebuild "$version" "$kmod" >"$work/go.mod"
  cat >"$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  long "downloading the node's modules" "under a minute" quietly "$work/tidy.log" bash -c "cd '$work' && go mod tidy"
  minor=${version#1.}; minor=${minor%%.*}
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  mkdir -p "$work/out"
  long "building kubelet, kube-scheduler and kube-controller-manager v$version from source" "2 to 4 min" \
    bash -c "cd '$work' && CGO_ENABLED=0 go build -trimpath -ldflags '$ldflags' -o '$work/out/' \
      k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager"
  mv "$work/out/"* "$bins/"
  log "built the node's binaries in $(( $(date +%s) - start ))s, into $bins; later runs reuse them"
  echo "$bins"
}

# The images every node holds: the task image (Debian's static busybox) and the sandbox
# image (hack/pause), named where no registry is asked.
busybox_image=flyte.local/busybox:1
pause_image=flyte.local/pause:1
# The registry every pull goes to: port 1 of loopback, where nothing listens (tcpmux, a
# port below 1024 that nothing of ours and no unprivileged program can take).
registry_port=1

images() { echo "$busybox_image"; }

# docker_archive writes a one-layer image of the directory $2, named $1, with command $3,
# as a docker-archive tarball to $4.
docker_archive() {
  local name=$1 rootfs=$2 cmd=$3 out=$4 work layer_sum config config_sum
  work=$(mktemp -d)
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$work/layer.tar" .
  layer_sum=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  mkdir -p "$work/$layer_sum"
  mv "$work/layer.tar" "$work/$layer_sum/layer.tar"
  config=$(printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"Cmd":["%s"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$cmd" "$layer_sum")
  config_sum=$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)
  printf '%s' "$config" >"$work/$config_sum.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$config_sum" "$name" "$layer_sum" >"$work/manifest.json"
  tar -C "$work" -cf "$out" manifest.json "$config_sum.json" "$layer_sum"
  rm -rf "$work"
}

# build_images makes the two images' tarballs in $1.
build_images() {
  local dir=$1 rootfs
  rootfs=$(mktemp -d)
  mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc"
  cp /bin/busybox "$rootfs/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [[ "$applet" == busybox ]] || ln -s busybox "$rootfs/bin/$applet"
  done
  echo 'root:x:0:0:root:/:/bin/sh' >"$rootfs/etc/passwd"
  docker_archive "$busybox_image" "$rootfs" sh "$dir/busybox.tar"
  rm -rf "$rootfs"
  rootfs=$(mktemp -d)
  mkdir -p "$rootfs/bin"
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$rootfs/bin/pause" ./hack/pause)
  docker_archive "$pause_image" "$rootfs" /bin/pause "$dir/pause.tar"
  rm -rf "$rootfs"
}

# free_port sets the variable named $1 to a TCP port no socket is bound to, below the
# kernel's ephemeral range (a port in it may be taken by any client's connect between
# this pick and the bind, which on a machine busy running tests happens) and not handed
# out before by this script.
picked=" "
free_port() {
  local p low
  low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  ((low > 20000 + 1000)) || low=40000
  while :; do
    p=$((20000 + RANDOM % (low - 20000)))
    [[ "$picked" == *" $p "* ]] && continue
    if [[ -z "$(ss -Htan "sport = :$p" 2>/dev/null)" ]]; then
      picked+="$p "
      printf -v "$1" '%s' "$p"
      return
    fi
  done
}

# alive reports whether the process started as $1 is still running.
alive() { [[ -f "$dir/pids/$1" ]] && kill -0 "$(cat "$dir/pids/$1")" 2>/dev/null; }

# fail reports why the node is not up: the message $1, the node's conditions from the API
# server $2 (CA $3, token $4, node $5) when given, and the end of the kubelet's log, so a
# failure in CI can be read from its output alone.
fail() {
  log "$1"
  if [[ $# -gt 1 ]]; then
    log "the node as the API server holds it:"
    curl -s --cacert "$3" -H "Authorization: Bearer $4" "$2/api/v1/nodes/$5" 2>&1 |
      tr -d '\n' | tr -s ' ' | grep -o '"taints":[^]]*]\|"conditions":[^]]*]' | head -c 4000 >&2 || true
    echo >&2
  fi
  for name in kubelet containerd kube-controller-manager; do
    [[ -f "$dir/logs/$name.log" ]] || continue
    alive "$name" || log "$name is not running"
    log "the last lines of $dir/logs/$name.log:"
    grep -v "nodeIP can.t be loopback" "$dir/logs/$name.log" | tail -n 25 | cut -c1-400 >&2
  done
  exit 1
}

# install_runtime installs containerd, runc and the CNI loopback plugin when missing.
install_runtime() {
  if command -v containerd >/dev/null && command -v runc >/dev/null && [[ -x /usr/lib/cni/loopback && -x /bin/busybox ]] &&
    command -v nsenter >/dev/null && command -v unshare >/dev/null && command -v ip >/dev/null; then
    return
  fi
  [[ $(id -u) == 0 ]] || { log "containerd and runc are missing, and installing them needs root"; exit 1; }
  local packages=(containerd runc containernetworking-plugins busybox-static iproute2 util-linux)
  long "installing ${packages[*]} from Debian's packages" "under a minute" \
    quietly "${TMPDIR:-/tmp}/flyte-node-apt.log" bash -c "DEBIAN_FRONTEND=noninteractive apt-get install -y -q ${packages[*]} ||
      { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q ${packages[*]}; }"
}

kubeconfig() { # name server token ca
  cat <<YAML
apiVersion: v1
kind: Config
clusters:
- name: node
  cluster: {server: "$2", certificate-authority: "$4"}
users:
- name: $1
  user: {token: "$3"}
contexts:
- name: $1
  context: {cluster: node, user: $1}
current-context: $1
YAML
}

# run starts a process in the background, its output in $dir/logs/$1.log, its PID in
# $dir/pids/$1.
run() {
  local name=$1
  shift
  setsid "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/pids/$name"
}

start() {
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  [[ $(id -u) == 0 ]] || { log "a node needs root (containerd, kubelet)"; exit 1; }
  install_runtime
  local bins assets
  bins=$(build)
  assets=$(dirname "$bins")
  mkdir -p "$dir"/{logs,pids,pki,etcd,apiserver,kubelet,containerd,cni/bin,cni/conf,images}
  local id node etcd_port peer_port api_port kubelet_port healthz_port
  id=$(basename "$dir" | tr -c 'a-z0-9\n' '-' | tail -c 20)
  node=flyte-node
  free_port etcd_port; free_port peer_port; free_port api_port
  free_port kubelet_port; free_port healthz_port
  echo "$id" >"$dir/id"

  # Credentials: a service-account key, and a token per component.
  openssl genrsa -out "$dir/pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$dir/pki/sa.key" -pubout -out "$dir/pki/sa.pub" 2>/dev/null
  local admin kubelet_token scheduler cm
  admin=$(openssl rand -hex 16); kubelet_token=$(openssl rand -hex 16)
  scheduler=$(openssl rand -hex 16); cm=$(openssl rand -hex 16)
  cat >"$dir/pki/tokens.csv" <<CSV
$admin,admin,admin,"system:masters"
$kubelet_token,system:node:$node,kubelet,"system:nodes"
$scheduler,system:kube-scheduler,scheduler
$cm,system:kube-controller-manager,controller-manager
CSV

  log "starting etcd and kube-apiserver"
  run etcd "$assets/etcd" --data-dir "$dir/etcd" --name node \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "node=http://127.0.0.1:$peer_port" --unsafe-no-fsync
  run kube-apiserver "$assets/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" --cert-dir "$dir/apiserver" \
    --token-auth-file "$dir/pki/tokens.csv" --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$dir/pki/sa.pub" --service-account-signing-key-file "$dir/pki/sa.key" \
    --service-cluster-ip-range 10.96.0.0/24 --endpoint-reconciler-type none --allow-privileged \
    --enable-admission-plugins NodeRestriction
  local server="https://127.0.0.1:$api_port" ca="$dir/apiserver/apiserver.crt"
  local deadline=$((SECONDS + 120))
  until curl -sf --cacert "$ca" -H "Authorization: Bearer $admin" "$server/readyz" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { log "kube-apiserver did not become ready; see $dir/logs/kube-apiserver.log"; exit 1; }
    sleep 0.5
  done
  kubeconfig admin "$server" "$admin" "$ca" >"$dir/admin.kubeconfig"
  kubeconfig kubelet "$server" "$kubelet_token" "$ca" >"$dir/kubelet/kubeconfig"
  kubeconfig scheduler "$server" "$scheduler" "$ca" >"$dir/scheduler.kubeconfig"
  kubeconfig controller-manager "$server" "$cm" "$ca" >"$dir/controller-manager.kubeconfig"

  log "starting kube-controller-manager and kube-scheduler"
  run kube-controller-manager "$bins/kube-controller-manager" --kubeconfig "$dir/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false --use-service-account-credentials \
    --service-account-private-key-file "$dir/pki/sa.key" --root-ca-file "$ca" --cluster-name "$id"
  run kube-scheduler "$bins/kube-scheduler" --kubeconfig "$dir/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false

  start_node "$bins" "$assets" "$id" "$node" "$kubelet_port" "$healthz_port"

  log "waiting for the node to be Ready"
  deadline=$((SECONDS + 180))
  until node_ready "$server" "$ca" "$admin" "$node"; do
    alive kubelet || fail "the kubelet exited; see $dir/logs/kubelet.log"
    ((SECONDS < deadline)) || fail "the node did not become Ready; see $dir/logs/kubelet.log" "$server" "$ca" "$admin" "$node"
    sleep 0.5
  done
  echo "$dir/admin.kubeconfig"
}

# attach starts containerd, a kubelet and kube-scheduler in $1 for the API server of
# kubeconfig $2.
attach() {
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  [[ $(id -u) == 0 ]] || { log "a node needs root (containerd, kubelet)"; exit 1; }
  [[ -f "$2" ]] || { log "no kubeconfig at $2"; exit 1; }
  install_runtime
  local bins assets id node=flyte-node
  bins=$(build)
  assets=$(dirname "$bins")
  mkdir -p "$dir"/{logs,pids,kubelet,containerd,cni/bin,cni/conf,images}
  id=$(basename "$dir" | tr -c 'a-z0-9\n' '-' | tail -c 20)
  echo "$id" >"$dir/id"
  cp "$2" "$dir/kubelet/kubeconfig"
  log "starting kube-scheduler"
  run kube-scheduler "$bins/kube-scheduler" --kubeconfig "$dir/kubelet/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false
  local kubelet_port healthz_port
  free_port kubelet_port; free_port healthz_port
  start_node "$bins" "$assets" "$id" "$node" "$kubelet_port" "$healthz_port"
  echo "$node"
}

# start_node starts containerd and the kubelet in $dir: node binaries $1, assets $2, the
# node's id $3 and name $4, the kubelet's port $5 and healthz port $6; the kubelet's
# kubeconfig is $dir/kubelet/kubeconfig.
start_node() {
  local bins=$1 assets=$2 id=$3 node=$4 kubelet_port=$5 healthz_port=$6 deadline
  log "starting containerd"
  for plugin in loopback; do ln -sf "/usr/lib/cni/$plugin" "$dir/cni/bin/$plugin"; done
  ln -sf "$here/hack/cni/isolated" "$dir/cni/bin/isolated"
  printf '{"cniVersion":"1.0.0","name":"isolated","plugins":[{"type":"isolated"}]}\n' >"$dir/cni/conf/10-isolated.conflist"
  cat >"$dir/containerd/config.toml" <<TOML
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
[grpc]
  address = "$dir/containerd/containerd.sock"
[ttrpc]
  address = "$dir/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$dir/containerd/registries"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$dir/cni/bin"
    conf_dir = "$dir/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
TOML
  # Every registry is served by a closed port on loopback: _default applies to each host
  # without a directory of its own, and "server" replaces the registry's own address, so
  # an image the node does not hold fails to pull at once, without even a DNS query.
  # containerd 1.6 refuses a file without a host table, and then falls back to the
  # registry itself: the table is needed (TestPullsReachOnlyLoopback holds this).
  mkdir -p "$dir/containerd/registries/_default"
  cat >"$dir/containerd/registries/_default/hosts.toml" <<TOML
server = "http://127.0.0.1:$registry_port"
[host."http://127.0.0.1:$registry_port"]
  capabilities = ["pull", "resolve"]
TOML
  run containerd containerd --config "$dir/containerd/config.toml"
  deadline=$((SECONDS + 60))
  until ctr --address "$dir/containerd/containerd.sock" version >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { log "containerd did not start; see $dir/logs/containerd.log"; exit 1; }
    sleep 0.2
  done
  local cached_images="$assets/node/images"
  if [[ ! -f "$cached_images/pause.tar" || ! -f "$cached_images/busybox.tar" ]]; then
    log "building the pause and busybox images"
    mkdir -p "$cached_images"
    build_images "$cached_images"
  fi
  for image in pause busybox; do
    ctr --address "$dir/containerd/containerd.sock" -n k8s.io images import "$cached_images/$image.tar" >/dev/null
  done

  log "starting kubelet"
  # Its cgroups live under a root of this node's own, so that nodes side by side (and
  # what they leave behind) do not meet.
  local cgroup_root="/flytenode-$id"
  for controller in /sys/fs/cgroup/*/; do
    [[ -d "$controller" && ! -L "${controller%/}" ]] && mkdir -p "$controller${cgroup_root#/}"
  done
  cat >"$dir/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: $cgroup_root
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
podLogsDir: $dir/kubelet/pod-logs
enforceNodeAllocatable: []
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
registerNode: true
YAML
  run kubelet "$bins/kubelet" --config "$dir/kubelet/config.yaml" --kubeconfig "$dir/kubelet/kubeconfig" \
    --root-dir "$dir/kubelet/root" --cert-dir "$dir/kubelet/pki" --hostname-override "$node" --node-ip 127.0.0.1
}

# node_ready reports whether the node is Ready and without the not-ready taint.
node_ready() {
  local json
  json=$(curl -sf --cacert "$2" -H "Authorization: Bearer $3" "$1/api/v1/nodes/$4" 2>/dev/null) || return 1
  tr -d ' \n' <<<"$json" | grep -q '"type":"Ready","status":"True"' || return 1
  ! tr -d ' \n' <<<"$json" | grep -q 'node.kubernetes.io/not-ready'
}

stop() {
  dir=$(cd "$1" 2>/dev/null && pwd) || return 0
  local sock="$dir/containerd/containerd.sock"
  # Containers first, while containerd still answers; then the processes, newest first.
  if [[ -S "$sock" ]]; then
    for task in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
    done
  fi
  for name in kubelet containerd kube-scheduler kube-controller-manager kube-apiserver etcd; do
    [[ -f "$dir/pids/$name" ]] || continue
    local pid
    pid=$(cat "$dir/pids/$name")
    kill -TERM "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "-$pid" 2>/dev/null || true
    rm -f "$dir/pids/$name"
  done
  # The shims outlive containerd; they are this node's when they serve its socket.
  pkill -KILL -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null || true
  # Mounts under DIR (the kubelet's volumes, containerd's snapshots), deepest first.
  awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  if [[ -f "$dir/id" ]]; then
    local id
    id=$(cat "$dir/id")
    for controller in /sys/fs/cgroup/*/; do
      [[ -d "$controller/flytenode-$id" ]] && find "$controller/flytenode-$id" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
  fi
}

case "${1:-}" in
  build) build ;;
  install) install_runtime ;;
  images) images ;;
  start) [[ -n "${2:-}" ]] || { echo "usage: hack/node.sh start DIR" >&2; exit 2; }; start "$2" ;;
  attach) [[ -n "${2:-}" && -n "${3:-}" ]] || { echo "usage: hack/node.sh attach DIR KUBECONFIG" >&2; exit 2; }; attach "$2" "$3" ;;
  stop) [[ -n "${2:-}" ]] || { echo "usage: hack/node.sh stop DIR" >&2; exit 2; }; stop "$2" ;;
  *) echo "usage: hack/node.sh build | install | start DIR | images | stop DIR" >&2; exit 2 ;;
esac
