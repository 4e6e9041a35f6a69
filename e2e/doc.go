// Package e2e holds tests of the whole system running together in one process: the
// executor on a real API server (envtest), the events and cache services on a real
// Postgres, and a real Jaeger receiving their traces. The tests are the package; it has
// no code of its own.
package e2e
