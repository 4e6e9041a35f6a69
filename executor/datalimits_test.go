package executor_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/test/kubetest"
)

// TestASparseErrorDocumentFailsOnlyItsAction: a container action whose pod leaves a
// sparse 64 GiB error.json (it costs the task nothing) fails for good as the user's
// error, naming the limit and the object, without the executor reading it: its heap does
// not grow by the file, it keeps running, and another namespace's action then succeeds.
// Before, the executor read the file whole and died, and so did the standby that took
// over.
func TestASparseErrorDocumentFailsOnlyItsAction(t *testing.T) {
	ctx := context.Background()
	hostile, other := env.Namespace(t), env.Namespace(t)
	dir := t.TempDir()
	cfg := testConfig()
	cfg.Storage.AllowedPrefixes = []string{"file://" + dir + "/"}
	cfg.K8s.MountFileStorage = true
	cfg.Namespaces = []string{hostile, other}
	kubetest.RunManager(t, func(ctx context.Context) (manager.Manager, error) {
		return executor.Setup(ctx, cfg, env.Config, slog.New(slog.DiscardHandler), inProcess())
	})
	action := func(ns, name string) *flytev1.TaskAction {
		ta := containerAction(ns, name, 2)
		ta.Spec.InputURI, ta.Spec.RunOutputBase = "", "file://"+dir+"/"+ns+"/r1"
		return ta
	}
	completed := &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: metav1.Now(), FinishedAt: metav1.Now()}

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ta := action(hostile, "sparse")
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, hostile, "sparse-1")
	outputs := stagedOutput(t, pod)
	// What `truncate -s 64G error.json` in the task's container does.
	f, err := os.Create(filepath.Join(outputs, "error.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(f.Truncate(64<<30), f.Close()); err != nil {
		t.Fatal(err)
	}
	kubelet(t, pod, corev1.PodSucceeded, completed)

	got := waitFailed(t, client.ObjectKeyFromObject(ta))
	e := got.Status.Error
	uri := "file://" + dir + "/" + hostile + "/r1/sparse/1/error.json"
	if e == nil || e.Code != flytek8s.CodeErrorDocumentTooLarge || e.Kind != flytev1.ErrorKindUser || got.Status.Attempts != 1 ||
		!strings.Contains(e.Message, datastore.SettingMaxDocumentBytes) || !strings.Contains(e.Message, uri) {
		t.Fatalf("status %+v; want one attempt failed for good with %s, a user error naming %s and %s",
			got.Status, flytek8s.CodeErrorDocumentTooLarge, uri, datastore.SettingMaxDocumentBytes)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 64<<20 {
		t.Fatalf("the heap grew by %d MiB", grew>>20)
	}

	ok := action(other, "after")
	if err := env.Client.Create(ctx, ok); err != nil {
		t.Fatal(err)
	}
	kubelet(t, waitPod(t, other, "after-1"), corev1.PodSucceeded, completed)
	waitSucceeded(t, client.ObjectKeyFromObject(ok))
}

// stagedOutput is the host directory a pod mounts as its output.
func stagedOutput(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	for _, v := range pod.Spec.Volumes {
		if v.Name == flytek8s.OutputsVolume && v.HostPath != nil {
			return v.HostPath.Path
		}
	}
	t.Fatalf("pod %s mounts no staged output", pod.Name)
	return ""
}
