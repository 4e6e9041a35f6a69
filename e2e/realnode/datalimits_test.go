package realnode_test

import (
	"path/filepath"
	"strings"
	"testing"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
)

// TestASparseErrorDocumentOfARealPodFailsOnlyItsAction: a task that runs `truncate -s
// 64G` on its error.json (a sparse file: it costs the task nothing) fails for good as
// the user's error naming the limit, without the executor reading it; the executor runs
// on, and the next action succeeds. Before the limit the executor read the file whole
// and died of it.
func TestASparseErrorDocumentOfARealPodFailsOnlyItsAction(t *testing.T) {
	ns := node.Namespace(t)
	data := t.TempDir()
	runExecutor(t, ns, func(c *config.Config) {
		c.Storage.AllowedPrefixes, c.K8s.MountFileStorage = []string{"file://" + data}, true
	})
	hostile := containerAction(ns, "sparse", 2, `out=${FLYTE_OUTPUT_PREFIX#file://}; truncate -s 64G $out/error.json && ls -ls $out`)
	hostile.Spec.RunOutputBase = "file://" + filepath.Join(data, "runs")
	create(t, hostile)
	got := waitFinished(t, hostile)
	e := got.Status.Error
	if got.Status.Phase != flytev1.PhaseFailed || e == nil || e.Code != flytek8s.CodeErrorDocumentTooLarge || e.Kind != flytev1.ErrorKindUser ||
		got.Status.Attempts != 1 || !strings.Contains(e.Message, datastore.SettingMaxDocumentBytes) || !strings.Contains(e.Message, "error.json") {
		t.Fatalf("ended %s (%s), error %+v; want one attempt failed for good with %s naming %s",
			got.Status.Phase, history(got), e, flytek8s.CodeErrorDocumentTooLarge, datastore.SettingMaxDocumentBytes)
	}

	next := containerAction(ns, "next", 0, `echo '{"ok": true}' > ${FLYTE_OUTPUT_PREFIX#file://}/outputs.json`)
	next.Spec.RunOutputBase = "file://" + filepath.Join(data, "runs")
	create(t, next)
	if got := waitFinished(t, next); got.Status.Phase != flytev1.PhaseSucceeded {
		t.Fatalf("the next action ended %s (%s); want Succeeded", got.Status.Phase, history(got))
	}
}
