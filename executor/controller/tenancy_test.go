package controller_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/controller"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/test/kubetest"
)

// TestActionsOfAnotherProjectAreRefusedBeforeAnythingIsDone plays a tenant who may
// create TaskActions in its own namespace (of project demo) and names another team's
// project in them: to poison that team's cache, to copy the team's input into the
// team's store, and to record events over the team's finished action. Each is refused
// before anything is read, written or reported: the team's next run of the task misses
// and runs, its stored history and outputs stay its own, and its listings show no run
// the tenant made up.
func TestActionsOfAnotherProjectAreRefusedBeforeAnythingIsDone(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	theirProject := "team-" + ns[len(ns)-6:]
	theirNS := kubetest.ProjectNamespace(t, env.Client, theirProject)
	theirPart := filepath.Join(dataDir, "projects", theirProject, "development")
	write := func(path, content string) string {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return "file://" + path
	}
	const inputs = `{"weights": "theirs"}`
	cacheable := func(namespace, name, inputURI, outputBase string) *flytev1.TaskAction {
		ta := newAction(namespace, name, "test-echo", nil)
		ta.Spec.Project, ta.Spec.TaskName, ta.Spec.RunName = theirProject, "team.train", "train"
		ta.Spec.InputURI, ta.Spec.RunOutputBase = inputURI, outputBase
		ta.Spec.Cache = &flytev1.CacheSpec{Enabled: true, Version: "1"}
		return ta
	}

	// The tenant's forgeries: a cacheable action with the team's task, version and
	// inputs, in a run the team never made, and an echo of the team's input into the
	// team's store under the name of the team's own action.
	poison := cacheable(ns, "poison", write(filepath.Join(dataDir, ns, "inputs.json"), inputs), "mem://outputs/"+ns)
	poison.Spec.RunName = "made-up"
	create(t, poison)
	refused := waitFor(t, poison, "refused", terminal)
	checkRefused(t, refused, ns, theirProject)

	// The team runs its task: a miss that runs, not a hit on the tenant's outputs.
	theirs := cacheable(theirNS, "theirs", write(filepath.Join(theirPart, "train", "inputs.json"), inputs), "file://"+filepath.Join(theirPart, "train"))
	create(t, theirs)
	got := waitFor(t, theirs, "delivered", delivered)
	if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.CacheStatus != flytev1.CachePopulated || !slices.Contains(calls.get(theirs.Name), "handle:1") {
		t.Fatalf("the team's action: %s, cache %s, calls %v; want a miss that ran", got.Status.Phase, got.Status.CacheStatus, calls.get(theirs.Name))
	}
	theirEvents := storedEvents(t, got)
	outputs := filepath.Join(theirPart, "train", "theirs", "1", "outputs.json")
	theirOutputs, err := os.ReadFile(outputs)
	if err != nil {
		t.Fatal(err)
	}

	overwrite := newAction(ns, "overwrite", "test-echo", nil)
	overwrite.Spec.Project, overwrite.Spec.RunName, overwrite.Spec.ActionName = theirProject, theirs.Spec.RunName, theirs.Spec.ActionName
	overwrite.Spec.InputURI, overwrite.Spec.RunOutputBase = theirs.Spec.InputURI, theirs.Spec.RunOutputBase
	create(t, overwrite)
	checkRefused(t, waitFor(t, overwrite, "refused", terminal), ns, theirProject)

	if after := storedEvents(t, got); len(after) != len(theirEvents) || after[len(after)-1].GetPhase() != theirEvents[len(theirEvents)-1].GetPhase() {
		t.Fatalf("the team's stored history changed: %d events, last %v; was %d, last %v", len(after), after[len(after)-1], len(theirEvents), theirEvents[len(theirEvents)-1])
	}
	if now, err := os.ReadFile(outputs); err != nil || string(now) != string(theirOutputs) {
		t.Fatalf("the team's outputs are %q (%v); were %q", now, err, theirOutputs)
	}
	list, err := eventsSvc.client().ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: theirProject, Domain: "development"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range list.Msg.GetActions() {
		if run := a.GetId().GetRun(); run != theirs.Spec.RunName {
			t.Fatalf("the team's listing holds run %q, which the team never made", run)
		}
	}
	for _, ta := range []*flytev1.TaskAction{poison, overwrite} {
		if c := calls.get(ta.Name); len(c) != 0 {
			t.Fatalf("%s was refused but its plugin was called: %v", ta.Name, c)
		}
	}
}

// checkRefused checks that an action of namespace ns that named project was refused
// before anything was done: nothing in its history (which is what reaches the events
// service), no finalizer, no attempt, and a message naming both.
func checkRefused(t *testing.T, ta *flytev1.TaskAction, ns, project string) {
	t.Helper()
	st := ta.Status
	if st.Phase != flytev1.PhaseFailed || st.Error == nil || st.Error.Code != flytev1.ReasonProjectNotOfNamespace {
		t.Fatalf("%s: phase %s, error %+v; want Failed, %s", ta.Name, st.Phase, st.Error, flytev1.ReasonProjectNotOfNamespace)
	}
	if !strings.Contains(st.Error.Message, `"`+ns+`"`) || !strings.Contains(st.Error.Message, `"`+project+`"`) {
		t.Fatalf("%s: the refusal %q does not name the namespace %q and the project %q", ta.Name, st.Error.Message, ns, project)
	}
	if len(st.PhaseHistory) != 0 || st.Attempts != 0 || controllerutil.ContainsFinalizer(ta, controller.Finalizer) {
		t.Fatalf("%s: history %s, %d attempts, finalizers %v; want none of them", ta.Name, history(ta), st.Attempts, ta.Finalizers)
	}
	if !publisher.Delivered(ta) {
		t.Fatalf("%s: the refusal waits to be delivered; nothing of it may reach the events service", ta.Name)
	}
}
