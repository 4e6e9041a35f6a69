// Package systemtest runs the system as a deployment runs it, for the tests that need
// every program as a process of its own (the chaos soak, the upgrade test): a program
// started, stopped, killed and started again with its exits counted (Proc); etcd and
// kube-apiserver from the envtest assets, behind TLS and a static administrator's token,
// that a program reaches through a kubeconfig (ControlPlane); and the set-up steps both
// tests share (a database of the services, a CRD applied and served).
package systemtest
