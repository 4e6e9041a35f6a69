package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/source"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/plugins/core/sleep"
	"github.com/flytekube/backend/internal/backoff"
)

// The finalizer, pass by pass, with every write of each pass in order. With an events
// service, every action gets it first, before anything else of its first pass, and loses
// it once its history is delivered. Without one, a plugin that creates things outside the
// action gets it the same way before its first Handle; an in-process one only if its
// first pass leaves it running, right before that pass's status; an action finished in
// one pass never. A deleted action is recorded Aborted, then let go.
func TestFinalizerPassByPass(t *testing.T) {
	tests := []struct {
		name     string
		events   bool
		taskType string
		config   map[string]string
		// passes are the writes of each pass until the action settles; deleted, those
		// of each pass after its deletion.
		passes, deleted [][]string
	}{{
		name: "no events, finished in its first pass", taskType: sleep.ID, config: map[string]string{"duration": "0s"},
		passes: [][]string{{"status Succeeded"}},
	}, {
		name: "no events, in-process and left running", taskType: sleep.ID, config: map[string]string{"duration": "1h"},
		passes:  [][]string{{"finalizer on", "status Running"}},
		deleted: [][]string{{"status Aborted", "finalizer off"}},
	}, {
		name: "no events, in-process and retried in its first pass", taskType: sleep.ID, config: map[string]string{"failAttempts": "1"},
		passes: [][]string{{"finalizer on", "status Queued"}, {"status Succeeded", "finalizer off"}},
	}, {
		name: "no events, a plugin that creates things outside the action", taskType: "test-outside",
		passes:  [][]string{{"finalizer on", "status Running"}},
		deleted: [][]string{{"status Aborted", "finalizer off"}},
	}, {
		name: "no events, an unknown task type", taskType: "no-such-type",
		passes: [][]string{{"status Failed"}},
	}, {
		name: "events, finished in its first pass", events: true, taskType: sleep.ID, config: map[string]string{"duration": "0s"},
		passes: [][]string{{"finalizer on", "status Succeeded"}, {"finalizer off"}},
	}, {
		name: "events, in-process and left running", events: true, taskType: sleep.ID, config: map[string]string{"duration": "1h"},
		passes:  [][]string{{"finalizer on", "status Running"}},
		deleted: [][]string{{"status Aborted"}, {"finalizer off"}},
	}, {
		name: "events, an unknown task type", events: true, taskType: "no-such-type",
		passes: [][]string{{"finalizer on", "status Failed"}, {"finalizer off"}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newPassHarness(t, tt.events, &flytev1.TaskAction{
				ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", UID: "uid-a"},
				Spec: flytev1.TaskActionSpec{Project: "ns", TaskType: tt.taskType, Config: tt.config, Retries: 1,
					RunOutputBase: "mem://outputs/r1"},
			})
			if got := h.passUntilSettled(t); !slices.EqualFunc(got, tt.passes, slices.Equal) {
				t.Fatalf("writes by pass %q; want %q", got, tt.passes)
			}
			if tt.deleted == nil {
				return
			}
			h.delete(t)
			if got := h.passUntilSettled(t); !slices.EqualFunc(got, tt.deleted, slices.Equal) {
				t.Fatalf("writes by pass after the deletion %q; want %q", got, tt.deleted)
			}
		})
	}
}

// passHarness runs a reconciler's passes over one action on a fake API server,
// recording the writes of each pass.
type passHarness struct {
	r      *TaskActionReconciler
	c      client.WithWatch
	clock  *clocktesting.FakePassiveClock
	key    types.NamespacedName
	sink   *laterSink
	writes []string
}

func newPassHarness(t *testing.T, events bool, ta *flytev1.TaskAction) *passHarness {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := errors.Join(flytev1.AddToScheme(scheme), corev1.AddToScheme(scheme)); err != nil {
		t.Fatal(err)
	}
	h := &passHarness{key: client.ObjectKeyFromObject(ta), clock: clocktesting.NewFakePassiveClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))}
	// The action's namespace, of its project.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ta.Namespace}}
	h.c = fake.NewClientBuilder().WithScheme(scheme).WithObjects(ta, ns).WithStatusSubresource(ta).
		WithInterceptorFuncs(interceptor.Funcs{
			Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				h.writes = append(h.writes, map[bool]string{true: "finalizer on", false: "finalizer off"}[controllerutil.ContainsFinalizer(obj, Finalizer)])
				return c.Patch(ctx, obj, patch, opts...)
			},
			SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				h.writes = append(h.writes, fmt.Sprintf("%s %s", sub, obj.(*flytev1.TaskAction).Status.Phase))
				return c.SubResource(sub).Update(ctx, obj, opts...)
			},
		}).Build()
	log := slog.New(slog.DiscardHandler)
	reg := core.NewRegistry(log)
	for _, e := range []core.Entry{sleep.Entry(), core.CoreEntry(outsidePlugin{})} {
		if err := reg.Register(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := reg.Initialize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	h.r = &TaskActionReconciler{Client: h.c, Registry: reg, Log: log, Clock: h.clock,
		Options: Options{MaxSystemFailures: 1, Backoff: backoff.Backoff{Base: time.Second, Cap: time.Second}}}
	if events {
		h.sink = &laterSink{pending: map[types.UID]flytev1.HistoryMark{}, delivered: map[types.UID]flytev1.HistoryMark{}}
		h.r.Events = h.sink
	}
	return h
}

// passUntilSettled runs passes until one asks for none soon (an hour's sleep, a plugin
// that watches its pod) and nothing waits for a delivery, and returns the writes of each
// pass that wrote. Between passes the sink delivers what it was handed, and a backoff (a
// second at most) passes at once.
func (h *passHarness) passUntilSettled(t *testing.T) [][]string {
	t.Helper()
	var passes [][]string
	for range 10 {
		h.writes = nil
		result, err := h.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: h.key})
		if err != nil {
			t.Fatalf("pass %d: %v", len(passes)+1, err)
		}
		if len(h.writes) > 0 {
			passes = append(passes, h.writes)
		}
		woken := h.sink != nil && h.sink.deliver()
		if !woken && (result.RequeueAfter == 0 || result.RequeueAfter > time.Second) {
			return passes
		}
		h.clock.SetTime(h.clock.Now().Add(result.RequeueAfter))
	}
	t.Fatalf("the action never settled; writes by pass %q", passes)
	return nil
}

func (h *passHarness) delete(t *testing.T) {
	t.Helper()
	var ta flytev1.TaskAction
	if err := h.c.Get(context.Background(), h.key, &ta); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Delete(context.Background(), &ta); err != nil {
		t.Fatal(err)
	}
}

// laterSink delivers what it is handed when told to (deliver), as the publisher does
// from its own goroutine, and reports whether a release waits to be woken by that.
type laterSink struct {
	pending, delivered map[types.UID]flytev1.HistoryMark
	wake               bool
}

func (s *laterSink) Enqueue(ta *flytev1.TaskAction) {
	if last, ok := ta.Status.PhaseHistory.Last(); ok && !s.Delivered(ta) {
		s.pending[ta.UID] = last.Mark()
	}
}

func (s *laterSink) Delivered(ta *flytev1.TaskAction) bool {
	last, ok := ta.Status.PhaseHistory.Last()
	return !ok || s.delivered[ta.UID] == last.Mark()
}

func (s *laterSink) ReleaseWhenDelivered(ta *flytev1.TaskAction) bool {
	if s.Delivered(ta) {
		return true
	}
	s.Enqueue(ta)
	s.wake = true
	return false
}

// deliver delivers what is pending, and reports whether a release waited for it.
func (s *laterSink) deliver() bool {
	for uid, m := range s.pending {
		s.delivered[uid] = m
	}
	clear(s.pending)
	woken := s.wake
	s.wake = false
	return woken
}

func (s *laterSink) Forget(types.NamespacedName) {}
func (s *laterSink) Source() source.Source       { return nil }

// outsidePlugin stands for a plugin whose attempts create things outside the action (a
// pod): it asks for the finalizer, and runs until aborted.
type outsidePlugin struct{}

func (outsidePlugin) GetID() string                  { return "test-outside" }
func (outsidePlugin) GetProperties() core.Properties { return core.Properties{NeedsFinalizer: true} }
func (outsidePlugin) Handle(context.Context, core.TaskExecutionContext) (core.Transition, error) {
	return core.DoTransition(core.PhaseInfoRunning(0, "")), nil
}
func (outsidePlugin) Abort(context.Context, core.TaskExecutionContext) error    { return nil }
func (outsidePlugin) Finalize(context.Context, core.TaskExecutionContext) error { return nil }
