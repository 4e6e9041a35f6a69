// Package chaos is a seeded chaos soak of the whole system: two executor replicas under
// leader election, the events and cache services, Postgres and a control plane (etcd and
// kube-apiserver), each a real process, run a mixed workload while faults fire at random
// times: the leader and each service killed with SIGKILL, Postgres restarted at once, the
// API server stopped and started again on the same etcd, a running pod deleted
// gracefully. A stand-in kubelet plays the node for container actions. Afterwards the
// soak holds the system to its promises and names every action that breaks one.
//
// Gray faults besides (grayfaults.go): toxiproxy, in the soak's process on 127.0.0.1
// (proxy.go), stands between the services and Postgres and between the executors and
// the API server, the events and the cache service, and makes one link slow, narrow or
// half-open for a while; the executors lose every events replica for longer than the
// collector's TTL; the data store's file system is frozen (store.go); the API server
// refuses to delete one action (undeletable.go). The invariants of invariants.go and
// watchers.go hold the system to a bound on the finished actions it stores, to every
// finish reaching a watcher on each events replica, to each program's memory limit and
// to what each fault may cost the work it does not touch.
//
// Beside the workload of namespace chaos runs a hostile tenant, namespace hostile
// (hostile.go): actions forging project chaos (an echo over a chaos action's name, input
// and store; a chaos cache key), a sparse 64 GiB error document, an output tree over the
// bound, an inline pod template taking over a platform template's privileged init
// container. Each must fail alone, with its own error code; the checks (tenants.go) find
// any trace of it in the chaos tenant's events, listings, files and cache entries, and
// any executor exit the soak did not cause. The control plane has no admission policy,
// so the executor's own tenancy check is what is tested.
//
// Everything random comes from one seed, so a failing run names the seed that replays
// its workload and its faults (timing on a shared machine varies, so a replay is the same
// plan, not the same interleaving).
package chaos
