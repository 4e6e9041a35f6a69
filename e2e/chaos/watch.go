package chaos

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// change is one thing a watch saw happen to an object.
type change struct {
	obj     client.Object
	deleted bool
	// relisted says the change was inferred from a new list after the watch lost its
	// place: its order against the other changes of that list is unknown.
	relisted bool
}

// follow lists and watches one kind in namespace ns until ctx ends, calling
// handle for every change in order. It survives the API server going away: a watch
// that ends is resumed from the last resource version seen, and when that version is
// gone, a new list is compared with what was known, deletions first, so that a pod
// replaced while the watch was down never looks alive beside its successor.
func follow(ctx context.Context, c client.WithWatch, ns string, newList func() client.ObjectList, handle func(change)) {
	known := map[string]client.Object{} // by name
	rv := ""
	for ctx.Err() == nil {
		if rv == "" {
			list := newList()
			lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			err := c.List(lctx, list, client.InNamespace(ns))
			cancel()
			if err != nil {
				sleep(ctx, time.Second)
				continue
			}
			items, err := meta.ExtractList(list)
			if err != nil {
				panic(fmt.Sprintf("chaos: extracting a list: %v", err))
			}
			seen := map[string]client.Object{}
			for _, it := range items {
				o := it.(client.Object)
				seen[o.GetName()] = o
			}
			relisted := len(known) > 0
			for name, old := range known {
				if now, ok := seen[name]; !ok || now.GetUID() != old.GetUID() {
					handle(change{obj: old, deleted: true, relisted: relisted})
					delete(known, name)
				}
			}
			for name, o := range seen {
				known[name] = o
				handle(change{obj: o, relisted: relisted})
			}
			rv = list.(metav1.ListInterface).GetResourceVersion()
		}
		wctx, cancel := context.WithCancel(ctx)
		w, err := c.Watch(wctx, newList(), client.InNamespace(ns),
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
		if err != nil {
			cancel()
			if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
				rv = ""
			}
			sleep(ctx, time.Second)
			continue
		}
		rv = drain(w, rv, known, handle)
		w.Stop()
		cancel()
	}
}

// drain handles a watch's events until it ends, and returns the version to resume from
// ("" to list again).
func drain(w watch.Interface, rv string, known map[string]client.Object, handle func(change)) string {
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Error:
			if status, ok := ev.Object.(*metav1.Status); ok && status.Code == 410 {
				return ""
			}
			return rv
		case watch.Bookmark:
			if o, ok := ev.Object.(client.Object); ok {
				rv = o.GetResourceVersion()
			}
			continue
		}
		o, ok := ev.Object.(client.Object)
		if !ok {
			continue
		}
		rv = o.GetResourceVersion()
		if ev.Type == watch.Deleted {
			delete(known, o.GetName())
			handle(change{obj: o, deleted: true})
			continue
		}
		if old, ok := known[o.GetName()]; ok && old.GetUID() != o.GetUID() {
			handle(change{obj: old, deleted: true}) // replaced between two events
		}
		known[o.GetName()] = o
		handle(change{obj: o})
	}
	return rv
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
