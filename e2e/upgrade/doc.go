// Package upgrade is the upgrade test, as Knative and Tekton run theirs: the previous
// release (built from its commit by test/release) runs as processes — an API server
// and etcd, Postgres, the events and cache services, the executor — with work in flight
// (long sleeps, retries, cacheable actions holding reservations while others wait,
// container actions on the stand-in kubelet or, with UPGRADE_NODE=real, on a real node,
// a watcher, a CloudEvents sink), and is upgraded to the tree in the documented order
// (docs/operations.md, "Upgrading"): the CRD, then the services (each new replica
// started beside the old, which it migrates, then the old stopped), then the executor
// (the new one a standby until the old one hands over its lease). Then the reverse, as
// far as docs/operations.md promises it: with a second batch of work in flight, the
// previous release's executor and then its services come back, on the tree's schema and
// CRD (a rollback leaves the newer CRD, which only adds). A probe meanwhile
// creates actions every 100 ms and calls every RPC of both services, through the
// services' address and on each replica, and logs each failure with its time.
//
// Afterwards it holds the system to what an upgrade in place promises: every action ends
// as planned, every history entry is stored once, every stored event reaches the sink
// (once, or twice at a relay's handover), every finish reaches the watcher, the cache
// answers what was put, and no probe call failed for longer than maxFailureRun.
//
// TestUpgrade runs a short form by default (make test) and a long one with UPGRADE_TEST=full (make upgrade-test
// FROM=v…); FROM (UPGRADE_FROM) names the release upgraded from, by default the last
// line of RELEASES.
package upgrade
