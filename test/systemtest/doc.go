// Package systemtest runs the system as a deployment runs it, for the tests that need
// every program as a process of its own (the chaos soak, the upgrade test), each one a
// test/process.Process: etcd and kube-apiserver from the envtest assets, behind TLS and a
// static administrator's token, that a program reaches through a kubeconfig
// (ControlPlane); an executor with its configuration file written, and where it answers
// (Executor, which make run uses too); a real node of that API server, containerd, a
// kubelet and kube-scheduler from hack/node.sh, as root (Node); a stand-in kubelet that
// plays the node for container actions where no real node runs (Kubelet); and the set-up
// steps both tests share (the tree's programs built, a database of the services).
package systemtest
