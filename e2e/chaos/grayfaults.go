package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// Gray faults: a dependency slow, narrow, half-open, away for long, a store that stalls,
// an object that cannot be deleted. Each holds for a while drawn from the seed and is
// then taken off.

// poisonLink puts one toxic on a link drawn from the seed, in both directions, for a
// few seconds. On the API server's link an executor may lose its lease meanwhile and
// exit, as designed: the span counts as an outage of the API server.
func (f *faults) poisonLink(ctx context.Context, kind string) error {
	link := links[f.rnd.IntN(len(links))]
	hold := f.hold(2*time.Second, 5*time.Second, 15*time.Second)
	var t toxic
	switch kind {
	case faultSlowLink:
		latency := 200 + f.rnd.IntN(1300)
		t = toxic{kind: "latency", attributes: fmt.Sprintf(`{"latency":%d,"jitter":%d}`, latency, latency/4)}
	case faultNarrowLink:
		t = toxic{kind: "bandwidth", attributes: fmt.Sprintf(`{"rate":%d}`, 4+f.rnd.IntN(60))} // KB/s
	case faultHalfOpen:
		t = toxic{kind: "timeout", attributes: `{"timeout":0}`} // never answers, never closes
	}
	f.count(kind)
	f.log("%s on %s (%s %s) for %s", kind, link, t.kind, t.attributes, hold)
	from := time.Now()
	if link == linkAPIServer {
		f.mu.Lock()
		f.outageFrom = from
		f.mu.Unlock()
	}
	err := f.s.proxy.poison(link, t)
	if err == nil {
		sleep(ctx, hold)
	}
	if herr := f.s.proxy.heal(context.WithoutCancel(ctx), link, kind == faultHalfOpen); err == nil {
		err = herr
	}
	f.mu.Lock()
	f.spans = append(f.spans, span{kind: kind, target: link, from: from, to: time.Now()})
	if link == linkAPIServer {
		f.outages = append(f.outages, window{from: from, to: time.Now().Add(30 * time.Second)})
		f.outageFrom = time.Time{}
	}
	f.mu.Unlock()
	return err
}

// eventsOutage cuts the executors off from every events replica for longer than the
// collector's TTL, then lets them reach it again. The services stay up, so that the
// soak's watchers on each replica see what is delivered once the outage ends.
func (f *faults) eventsOutage(ctx context.Context) error {
	hold := soakGCTTL + f.hold(2*time.Second, 6*time.Second, 30*time.Second)
	f.count(faultEventsOutage)
	f.log("%s for %s (gc.maxTTL %s)", faultEventsOutage, hold, soakGCTTL)
	from := time.Now()
	f.s.proxy.cut(linkEvents)
	sleep(ctx, hold)
	err := f.s.proxy.mend(linkEvents)
	f.record(faultEventsOutage, "events", from)
	return err
}

// stallStore freezes the data store's file system for a few seconds, longer than the
// executors' storage.callTimeout.
func (f *faults) stallStore(ctx context.Context) error {
	hold := soakStoreCallTimeout + f.hold(time.Second, 3*time.Second, 10*time.Second)
	f.count(faultStallStore)
	f.log("%s for %s (storage.callTimeout %s)", faultStallStore, hold, soakStoreCallTimeout)
	from := time.Now()
	if err := f.s.store.freeze(ctx); err != nil {
		return err
	}
	sleep(ctx, hold)
	err := f.s.store.thaw(context.WithoutCancel(ctx))
	f.record(faultStallStore, "store", from)
	return err
}

// makeUndeletable labels a chaos action the client keeps, finished if one is stored,
// so that the API server refuses to delete it (undeletable.go): once it has finished,
// the collector must go on collecting the rest.
func (f *faults) makeUndeletable(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var finished, unfinished []string
		f.obs.mu.Lock()
		for name, r := range f.obs.actions {
			if r.last == nil || r.gone || r.last.Namespace != taskNamespace || !f.kept(name) || f.undeletable[name] {
				continue
			}
			if r.last.Status.Phase.IsTerminal() {
				finished = append(finished, name)
			} else {
				unfinished = append(unfinished, name)
			}
		}
		f.obs.mu.Unlock()
		candidates := finished
		if len(candidates) == 0 {
			candidates = unfinished
		}
		if len(candidates) > 0 {
			slices.Sort(candidates)
			name := candidates[f.rnd.IntN(len(candidates))]
			ta := &flytev1.TaskAction{}
			ta.Name, ta.Namespace = name, taskNamespace
			patch := client.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"metadata":{"labels":{%q:"true"}}}`, undeletableLabel))
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := f.s.client.Patch(pctx, ta, patch)
			cancel()
			if err != nil {
				// Collected meanwhile, or the API server is away: draw again.
				sleep(ctx, time.Second)
				continue
			}
			f.count(faultUndeletable)
			f.mu.Lock()
			f.undeletable[name] = true
			f.spans = append(f.spans, span{kind: faultUndeletable, target: name, from: time.Now(), to: time.Now()})
			f.mu.Unlock()
			f.log("%s: %s", faultUndeletable, name)
			return nil
		}
		sleep(ctx, 500*time.Millisecond)
	}
	f.log("no finished action to make undeletable")
	return nil
}

// hold draws how long a fault holds: from least up to most in a run of minutes, up to
// shortMost in a short one (make test's), which must stay short.
func (f *faults) hold(least, shortMost, most time.Duration) time.Duration {
	if !f.long {
		most = shortMost
	}
	return least + time.Duration(f.rnd.Int64N(int64(most-least)+1)).Round(100*time.Millisecond)
}
