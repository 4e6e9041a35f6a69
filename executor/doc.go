// Package executor assembles the Kubernetes operator that runs TaskAction resources
// (flyte.org/v1) through plugins: Setup builds its controller-runtime manager from the
// configuration, and cmd/executor is the binary.
package executor
