package executor_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"gocloud.dev/gcerrors"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/cacheservice"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore/storetest"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

// flaky:// URIs are in-memory buckets that fail on demand.
var flaky = storetest.Register("flaky")

// httpStatus is a driver's error carrying the HTTP status of the reply, as the AWS SDK's
// ResponseError does: the s3 driver reports a 503 as gcerrors Unknown with it beneath.
type httpStatus int

func (h httpStatus) Error() string       { return fmt.Sprintf("HTTP %d", int(h)) }
func (h httpStatus) HTTPStatusCode() int { return int(h) }

// standInKubelet plays the node for every pod of namespace until the test ends: it
// writes the task's outputs where the pod's environment says (on flaky://), as the task
// would, and marks the pod succeeded.
func standInKubelet(t *testing.T, namespace string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		seen := map[string]bool{}
		for ctx.Err() == nil {
			var pods corev1.PodList
			if err := env.Client.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			for i := range pods.Items {
				pod := &pods.Items[i]
				if seen[pod.Name] {
					continue
				}
				var prefix string
				for _, e := range pod.Spec.Containers[0].Env {
					if e.Name == flytek8s.EnvOutputPrefix {
						prefix = e.Value
					}
				}
				// Outputs are written to flaky:// only; elsewhere the task wrote none.
				if u, err := url.Parse(prefix + "/outputs.json"); err == nil && u.Scheme == "flaky" {
					if err := flaky.Real(u.Host).WriteAll(ctx, strings.TrimPrefix(u.Path, "/"), []byte(`{"by": "`+pod.Name+`"}`), nil); err != nil {
						t.Errorf("kubelet: writing outputs: %v", err)
					}
				}
				now := metav1.Now()
				pod.Status.Phase = corev1.PodSucceeded
				pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: flytek8s.ContainerName, Image: pod.Spec.Containers[0].Image,
					State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}}}}
				if err := env.Client.Status().Update(ctx, pod); err == nil {
					seen[pod.Name] = true
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
}

// TestStoreFaultsNeverSucceedWithoutOutputs runs cacheable container actions whose
// outputs the store fails to tell about for a while after their pods succeeded. A
// transient fault is retried without charging the action: it succeeds with its outputs
// on its first attempt, and an identical action then hits the cache and gets the same
// outputs. A fault that retrying cannot change never becomes a success: the action
// fails on the system budget and leaves nothing in the cache, so an identical one runs.
func TestStoreFaultsNeverSucceedWithoutOutputs(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	pg := pgtest.New(t)
	cache := servicetest.Run(t, cacheservice.Run, cacheservice.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t), Auth: auth.Config{Mode: auth.ModeNone}})
	cfg := testConfig()
	cfg.CacheServiceURL = cache.URL
	cfg.RetryBackoff.Base = metav1.Duration{Duration: 50 * time.Millisecond}
	run(t, cfg, ns, nil)
	standInKubelet(t, ns)

	base := "flaky://out/" + ns + "/r1"
	tests := []struct {
		name      string
		op        storetest.Op
		file      string // of the attempt's output prefix
		code      gcerrors.ErrorCode
		cause     error
		times     int // < 0: for ever
		transient bool
	}{
		{name: "outputs-503", op: storetest.OpExists, file: "outputs.json", code: gcerrors.Unknown, cause: httpStatus(http.StatusServiceUnavailable), times: 3, transient: true},
		{name: "outputs-deadline", op: storetest.OpExists, file: "outputs.json", code: gcerrors.DeadlineExceeded, times: 3, transient: true},
		{name: "outputs-throttled", op: storetest.OpExists, file: "outputs.json", code: gcerrors.ResourceExhausted, times: 2, transient: true},
		{name: "error-doc-internal", op: storetest.OpRead, file: "error.json", code: gcerrors.Internal, times: 3, transient: true},
		{name: "outputs-denied", op: storetest.OpExists, file: "outputs.json", code: gcerrors.PermissionDenied, times: -1},
	}
	action := func(name, task string) *flytev1.TaskAction {
		ta := containerAction(ns, name, 1)
		ta.Spec.RunOutputBase, ta.Spec.InputURI = base, ""
		ta.Spec.TaskName = "demo." + task // one cache key per case
		ta.Spec.Cache = &flytev1.CacheSpec{Enabled: true, Version: "1"}
		return ta
	}
	for _, tt := range tests {
		flaky.FailWith(tt.op, ns+"/r1/"+tt.name+"/1/"+tt.file, tt.code, tt.cause, tt.times)
		if err := env.Client.Create(ctx, action(tt.name, tt.name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(flaky.Clear)

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := client.ObjectKey{Namespace: ns, Name: tt.name}
			want := flytev1.PhaseSucceeded
			if !tt.transient {
				want = flytev1.PhaseFailed
			}
			var ta flytev1.TaskAction
			eventually.True(t, time.Minute, func() bool {
				return env.Client.Get(ctx, key, &ta) == nil && ta.Status.Phase.IsTerminal()
			}, func() string { return fmt.Sprintf("%s did not finish; status %+v", key, ta.Status) })
			if ta.Status.Phase != want {
				t.Fatalf("%s ended %s (outputs %q, error %+v); want %s", key, ta.Status.Phase, ta.Status.OutputsURI, ta.Status.Error, want)
			}
			// The identical action: a hit only on outputs that were seen.
			again := action(tt.name+"-again", tt.name)
			if err := env.Client.Create(ctx, again); err != nil {
				t.Fatal(err)
			}
			got := waitSucceeded(t, client.ObjectKeyFromObject(again))

			if !tt.transient {
				if ta.Status.Error == nil || ta.Status.Error.Kind != flytev1.ErrorKindSystem || ta.Status.SystemFailures != int32(cfg.MaxSystemFailures)+1 {
					t.Fatalf("status %+v; want a system error after %d system failures", ta.Status, cfg.MaxSystemFailures+1)
				}
				if got.Status.CacheStatus == flytev1.CacheHit {
					t.Fatalf("the identical action hit a cache entry the failed one left: %+v", got.Status)
				}
				return
			}
			outputs := base + "/" + tt.name + "/1/outputs.json"
			if ta.Status.OutputsURI != outputs || ta.Status.CacheStatus != flytev1.CachePopulated {
				t.Fatalf("succeeded with outputs %q, cache %s; want %q, %s", ta.Status.OutputsURI, ta.Status.CacheStatus, outputs, flytev1.CachePopulated)
			}
			if ta.Status.Attempts != 1 || ta.Status.SystemFailures != 0 {
				t.Fatalf("the store's faults were charged: attempts %d, system failures %d", ta.Status.Attempts, ta.Status.SystemFailures)
			}
			if got.Status.CacheStatus != flytev1.CacheHit || got.Status.OutputsURI == "" {
				t.Fatalf("the identical action: cache %s, outputs %q; want a hit with outputs", got.Status.CacheStatus, got.Status.OutputsURI)
			}
			u, _ := url.Parse(got.Status.OutputsURI)
			data, err := flaky.Real(u.Host).ReadAll(ctx, strings.TrimPrefix(u.Path, "/"))
			if err != nil || string(data) != `{"by": "`+tt.name+`-1"}` {
				t.Fatalf("the hit's outputs hold %q, %v; want the first action's", data, err)
			}
		})
	}
	if n := flaky.Pending(); n != 0 {
		t.Fatalf("%d faults were never injected: the executor did not look again", n)
	}
}
