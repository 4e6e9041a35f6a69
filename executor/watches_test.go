package executor_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/test/eventually"
)

// configMapWaiter succeeds once a ConfigMap named after its action is in the executor's
// cache. It never asks to be looked at again: only a watch of ConfigMaps wakes it.
type configMapWaiter struct{ cache client.Reader }

func (configMapWaiter) GetID() string                  { return "configmap-waiter" }
func (configMapWaiter) GetProperties() core.Properties { return core.Properties{} }
func (w configMapWaiter) Handle(ctx context.Context, tCtx core.TaskExecutionContext) (core.Transition, error) {
	ta := tCtx.Metadata().Action()
	err := w.cache.Get(ctx, client.ObjectKey{Namespace: ta.Namespace, Name: ta.Name}, &corev1.ConfigMap{})
	switch {
	case apierrors.IsNotFound(err):
		return core.DoTransition(core.PhaseInfoRunning(0, "WaitingForConfigMap")), nil
	case err != nil:
		return core.Transition{}, err
	}
	return core.DoTransition(core.PhaseInfoSuccess("")), nil
}
func (configMapWaiter) Abort(context.Context, core.TaskExecutionContext) error    { return nil }
func (configMapWaiter) Finalize(context.Context, core.TaskExecutionContext) error { return nil }

// selfWatching declares the kind it watches on itself, the way the executor once read.
type selfWatching struct{ configMapWaiter }

func (selfWatching) ResourceToWatch() client.Object { return &corev1.ConfigMap{} }

func configMapEntry(watches client.Object, load func(cache client.Reader) core.Plugin) core.Entry {
	return core.Entry{ID: "configmap-waiter", RegisteredTaskTypes: []string{"configmap-waiter"}, Watches: watches,
		LoadPlugin: func(_ context.Context, setup core.SetupContext) (core.Plugin, error) {
			return load(setup.Cache()), nil
		}}
}

// TestWatchedKindsHaveOneSource: the kinds a plugin watches are its entry's Watches, which
// both restricts their informer to managed objects and makes their changes wake actions.
// A plugin that declares a watched kind on itself instead (a ResourceToWatch method,
// which once made the controller watch that kind without the restriction, caching every
// such object of the cluster) is refused when the executor starts.
func TestWatchedKindsHaveOneSource(t *testing.T) {
	self := func(cache client.Reader) core.Plugin { return selfWatching{configMapWaiter{cache}} }
	for _, tt := range []struct {
		name  string
		entry core.Entry
	}{
		{"on the plugin alone", configMapEntry(nil, self)},
		{"on the plugin and the entry", configMapEntry(&corev1.ConfigMap{}, self)},
	} {
		t.Run("refused: "+tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cfg := testConfig()
			cfg.Namespaces = []string{"default"}
			opts := inProcess()
			opts.Plugins = []core.Entry{tt.entry}
			_, err := executor.Setup(ctx, cfg, env.Config, slog.New(slog.DiscardHandler), opts)
			if err == nil || !strings.Contains(err.Error(), "ResourceToWatch") || !strings.Contains(err.Error(), "Entry.Watches") {
				t.Fatalf("Setup = %v; want it refused, naming ResourceToWatch and Entry.Watches", err)
			}
		})
	}

	t.Run("the entry's Watches", func(t *testing.T) {
		ctx := context.Background()
		ns := env.Namespace(t)
		_, mgr := start(t, testConfig(), ns, runOptions{plugins: []core.Entry{
			configMapEntry(&corev1.ConfigMap{}, func(cache client.Reader) core.Plugin { return configMapWaiter{cache} })}})
		ta := &flytev1.TaskAction{
			ObjectMeta: metav1.ObjectMeta{Name: "w0", Namespace: ns},
			Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "r1", ActionName: "w0",
				TaskName: "demo.wait", TaskType: "configmap-waiter", RunOutputBase: "mem://out/r1"},
		}
		if err := env.Client.Create(ctx, ta); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)

		// Someone else's ConfigMap stays out of the executor's cache.
		other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "someone-elses", Namespace: ns, Labels: map[string]string{"app": "web"}}}
		// The action's, labeled as the executor labels what it manages, wakes it.
		mine := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ta.Name, Namespace: ns, Labels: map[string]string{
			core.LabelManagedBy: core.ManagedByValue, core.LabelTaskActionUID: string(ta.UID)}}}
		for _, cm := range []*corev1.ConfigMap{other, mine} {
			if err := env.Client.Create(ctx, cm); err != nil {
				t.Fatal(err)
			}
		}
		var got flytev1.TaskAction
		eventually.True(t, 30*time.Second, func() bool {
			return env.Client.Get(ctx, client.ObjectKeyFromObject(ta), &got) == nil && got.Status.Phase == flytev1.PhaseSucceeded
		}, func() string {
			return fmt.Sprintf("the action's ConfigMap did not wake it: phase %s", got.Status.Phase)
		})
		if err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(other), &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
			t.Fatalf("an unmanaged ConfigMap is in the executor's cache: %v", err)
		}
	})
}
