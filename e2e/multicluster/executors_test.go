package multicluster_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/flytekube/backend/cacheservice"
	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

// TestTwoClustersOneEventsServiceOneCache: two control planes, an executor in each, one
// events service and one cache service. A task that both clusters run with the same
// inputs computes once when the clusters share the cache (cacheSharing: shared, the
// default): one action populates the entry, the other hits it. With cacheSharing:
// cluster each computes its own. With west's API server stopped, east's actions run and
// are recorded as before, each under its cluster.
func TestTwoClustersOneEventsServiceOneCache(t *testing.T) {
	pg := pgtest.New(t)
	for _, tc := range []struct {
		sharing string
		west    flytev1.CacheStatus // east's action runs first, and populates the entry
	}{
		{config.CacheShared, flytev1.CacheHit},
		{config.CachePerCluster, flytev1.CachePopulated},
	} {
		t.Run("cacheSharing "+tc.sharing, func(t *testing.T) {
			west := startWest(t)
			eventsSvc := servicetest.Run(t, events.Run, events.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t), Auth: auth.Config{Mode: auth.ModeNone}})
			cacheSvc := servicetest.Run(t, cacheservice.Run, cacheservice.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t), Auth: auth.Config{Mode: auth.ModeNone}})
			data := t.TempDir() // the data store both clusters share
			inputs := filepath.Join(data, "inputs.json")
			if err := os.WriteFile(inputs, []byte(`{"x": 42}`), 0o644); err != nil {
				t.Fatal(err)
			}
			task := fmt.Sprintf("e2e.echo-%d", time.Now().UnixNano()) // an entry of its own
			runIn := func(c *cluster) *runningExecutor {
				return startExecutor(t, c, eventsSvc.URL, cacheSvc.URL, data, tc.sharing)
			}
			eastExec, westExec := runIn(east), runIn(west)

			first := eastExec.run(t, "run-east", task, inputs)
			if first.Status.Phase != flytev1.PhaseSucceeded || first.Status.CacheStatus != flytev1.CachePopulated {
				t.Fatalf("east's action ended %s, cache %s; want Succeeded, Populated", first.Status.Phase, first.Status.CacheStatus)
			}
			second := westExec.run(t, "run-west", task, inputs)
			if second.Status.Phase != flytev1.PhaseSucceeded || second.Status.CacheStatus != tc.west {
				t.Fatalf("west's action of the same task and inputs ended %s, cache %s; want Succeeded, %s", second.Status.Phase, second.Status.CacheStatus, tc.west)
			}

			// West goes away, its executor with it (it runs there); east goes on, and its
			// action is recorded as east's.
			westExec.stop()
			if err := west.env.Stop(); err != nil {
				t.Fatal(err)
			}
			other := filepath.Join(data, "other.json")
			if err := os.WriteFile(other, []byte(`{"x": 7}`), 0o644); err != nil {
				t.Fatal(err)
			}
			third := eastExec.run(t, "run-east-2", task, other)
			if third.Status.Phase != flytev1.PhaseSucceeded || third.Status.CacheStatus != flytev1.CachePopulated {
				t.Fatalf("east's action with west gone ended %s, cache %s; want Succeeded, Populated", third.Status.Phase, third.Status.CacheStatus)
			}
			c := eventsv1connect.NewEventsServiceClient(eventsSvc.HTTP, eventsSvc.URL, connect.WithGRPC())
			for _, want := range []struct {
				cluster string
				ta      *flytev1.TaskAction
			}{{"east", first}, {"west", second}, {"east", third}} {
				id := &flytecorev1.ActionIdentifier{Project: want.ta.Spec.Project, Domain: want.ta.Spec.Domain, Run: want.ta.Spec.RunName, Action: want.ta.Spec.ActionName}
				resp, err := c.GetAction(context.Background(), connect.NewRequest(&eventsv1.GetActionRequest{Id: id, Cluster: proto.String(want.cluster)}))
				if err != nil || resp.Msg.GetAction().GetPhase() != flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED {
					t.Errorf("the events service's %s action %s/%s: %v, %v; want succeeded", want.cluster, id.GetRun(), id.GetAction(), resp, err)
				}
			}
		})
	}
}

// runningExecutor is an executor running in this process against one cluster.
type runningExecutor struct {
	cluster   *cluster
	namespace string
	delivered chan *flytev1.TaskAction
	stop      func()
}

// startExecutor runs the executor of cluster c, named after it in its events, with the
// shared services and data store, stopped at the end of t.
func startExecutor(t *testing.T, c *cluster, eventsURL, cacheURL, data, sharing string) *runningExecutor {
	t.Helper()
	e := &runningExecutor{cluster: c, namespace: projectNamespace(t, c), delivered: make(chan *flytev1.TaskAction, 4)}
	cfg := config.Default()
	cfg.Cluster, cfg.CacheSharing = c.name, sharing
	cfg.MetricsBindAddress, cfg.HealthProbeBindAddress = "0", "0"
	cfg.LeaderElect = false
	cfg.GC.Interval = metav1.Duration{}
	cfg.EventsServiceURL, cfg.CacheServiceURL = eventsURL, cacheURL
	cfg.Storage.AllowedPrefixes = []string{"file://" + data}
	cfg.Namespaces = []string{e.namespace}
	_, e.stop = kubetest.RunManager(t, func(ctx context.Context) (manager.Manager, error) {
		return executor.Setup(ctx, cfg, c.env.Config, slog.New(slog.DiscardHandler), executor.Options{
			SkipNameValidation: true, MetricsRegistry: prometheus.NewRegistry(),
			OnDelivered: func(ta *flytev1.TaskAction) { e.delivered <- ta },
		})
	})
	return e
}

// projectNamespace is a namespace of project e2e in c: east's is deleted at the end of
// t, a cluster t starts goes with its namespaces.
func projectNamespace(t *testing.T, c *cluster) string {
	t.Helper()
	if c == east {
		return kubetest.ProjectNamespace(t, c.env.Client, "e2e")
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e", Labels: map[string]string{kubetest.ProjectLabel: "e2e"}}}
	if err := c.env.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// run creates a cacheable echo action of task and waits until it has finished and its
// events are delivered.
func (e *runningExecutor) run(t *testing.T, run, task, inputs string) *flytev1.TaskAction {
	t.Helper()
	ta := &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: run, Namespace: e.namespace},
		Spec: flytev1.TaskActionSpec{Project: "e2e", Domain: "development", RunName: run, ActionName: "echo",
			TaskName: task, TaskType: "core-echo", InputURI: "file://" + inputs, RunOutputBase: "file://" + filepath.Join(filepath.Dir(inputs), e.cluster.name, run),
			Cache: &flytev1.CacheSpec{Enabled: true, Version: "1", Serializable: true}},
	}
	if err := e.cluster.env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case got := <-e.delivered:
			if got.Name == run {
				return got
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s's action %s did not finish with its events delivered", e.cluster.name, run)
		}
	}
}
