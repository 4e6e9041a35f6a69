package chaos

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestFirstRound: a seed orders every kind once, the same each time, with the kinds that
// act on the workload's actions first.
func TestFirstRound(t *testing.T) {
	for seed := range uint64(20) {
		order := firstRound(rand.New(rand.NewPCG(seed, 2)), faultKinds)
		again := firstRound(rand.New(rand.NewPCG(seed, 2)), faultKinds)
		if !slices.Equal(order, again) {
			t.Errorf("seed %d: %v, then %v", seed, order, again)
		}
		if order[0] != faultUndeletable || order[1] != faultDeleteRunning {
			t.Errorf("seed %d: starts %v; want %s then %s", seed, order[:2], faultUndeletable, faultDeleteRunning)
		}
		sorted := slices.Sorted(slices.Values(order))
		if want := slices.Sorted(slices.Values(faultKinds)); !slices.Equal(sorted, want) {
			t.Errorf("seed %d: %v; want each of %v once", seed, order, want)
		}
	}
}

// TestTouches: which faults may delay which action, for the fault-cost invariant.
func TestTouches(t *testing.T) {
	at := time.Now()
	for _, c := range []struct {
		sp         span
		kind, name string
		want       bool
	}{
		{span{kind: faultKillCache, target: "cacheservice"}, kindEcho, "a1", false},
		{span{kind: faultHalfOpen, target: linkCache}, kindSleep, "a1", false},
		{span{kind: faultHalfOpen, target: linkEvents}, kindSleep, "a1", true},
		{span{kind: faultSlowLink, target: linkPostgres}, kindEcho, "a1", true},
		{span{kind: faultUndeletable, target: "a2"}, kindEcho, "a1", false},
		{span{kind: faultUndeletable, target: "a1"}, kindEcho, "a1", true},
		{span{kind: faultDeleteRunning, target: "a2"}, kindSleep, "a1", false},
		{span{kind: faultStallStore, target: "store"}, kindSleep, "a1", false},
		{span{kind: faultStallStore, target: "store"}, kindSleepRetry, "a1", false},
		{span{kind: faultStallStore, target: "store"}, kindEcho, "a1", true},
		{span{kind: faultEventsOutage, target: "events"}, kindSleep, "a1", true},
		{span{kind: faultKillLeader, target: "executor-0"}, kindSleep, "a1", true},
	} {
		c.sp.from, c.sp.to = at, at
		if got := touches(c.sp, c.kind, c.name); got != c.want {
			t.Errorf("touches(%s on %s, %s %s) = %v, want %v", c.sp.kind, c.sp.target, c.kind, c.name, got, c.want)
		}
	}
}

// TestProgramOf: a replica's process is held to its program's memory limit.
func TestProgramOf(t *testing.T) {
	for name, want := range map[string]string{"executor-1": "executor", "events-0": "events", "cacheservice": "cacheservice",
		"kube-apiserver": "kube-apiserver", "etcd": "etcd"} {
		if got := programOf(name); got != want || memoryLimits[got] == 0 {
			t.Errorf("programOf(%q) = %q (limit %d), want %q with a limit", name, got, memoryLimits[got], want)
		}
	}
}
