package v1_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/repo"
)

var env *kubetest.Env

func TestMain(m *testing.M) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, flytev1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	os.Exit(kubetest.Main(m, &env, kubetest.Options{TaskActions: true, Scheme: scheme}))
}

func sample(t *testing.T, namespace string) *flytev1.TaskAction {
	t.Helper()
	var ta flytev1.TaskAction
	if err := repo.ReadYAML(&ta, "deploy", "samples", "taskaction-sleep.yaml"); err != nil {
		t.Fatalf("the sample does not decode: %v", err)
	}
	ta.Namespace = namespace
	return &ta
}

// createSample creates the sample in a namespace of the test's own.
func createSample(t *testing.T) *flytev1.TaskAction {
	t.Helper()
	ta := sample(t, env.Namespace(t))
	if err := env.Client.Create(ctx(t), ta); err != nil {
		t.Fatalf("creating the sample: %v", err)
	}
	return ta
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestHandWrittenSampleIsAdmitted(t *testing.T) {
	ta := createSample(t)
	var got flytev1.TaskAction
	if err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(ta), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Config["duration"] != "2s" || !got.Spec.Cache.Serializable || got.Spec.Retries != 2 || got.Spec.TaskType != "core-sleep" {
		t.Fatalf("stored spec %+v", got.Spec)
	}
}

func TestInvalidSpecsAreRejected(t *testing.T) {
	ns := env.Namespace(t)
	tests := []struct {
		name   string
		mutate func(*flytev1.TaskAction)
		want   string // part of the API server's message
	}{
		{"missing project", func(a *flytev1.TaskAction) { a.Spec.Project = "" }, "spec.project"},
		{"uppercase domain", func(a *flytev1.TaskAction) { a.Spec.Domain = "Development" }, "spec.domain"},
		{"run name too long", func(a *flytev1.TaskAction) { a.Spec.RunName = strings.Repeat("r", 64) }, "spec.runName"},
		{"action name with an underscore", func(a *flytev1.TaskAction) { a.Spec.ActionName = "a_0" }, "spec.actionName"},
		{"task name with a space", func(a *flytev1.TaskAction) { a.Spec.TaskName = "demo sleepy" }, "spec.taskName"},
		{"missing task type", func(a *flytev1.TaskAction) { a.Spec.TaskType = "" }, "spec.taskType"},
		{"missing output base", func(a *flytev1.TaskAction) { a.Spec.RunOutputBase = "" }, "spec.runOutputBase"},
		{"negative retries", func(a *flytev1.TaskAction) { a.Spec.Retries = -1 }, "spec.retries"},
		{"too many retries", func(a *flytev1.TaskAction) { a.Spec.Retries = 11 }, "spec.retries"},
		{"container task without a container", func(a *flytev1.TaskAction) { a.Spec.TaskType = "container" }, "taskType container needs a container section"},
		{"container without an image", func(a *flytev1.TaskAction) {
			a.Spec.TaskType = "container"
			a.Spec.Container = &flytev1.ContainerSpec{}
		}, "spec.container.image"},
		{"enabled cache without a version", func(a *flytev1.TaskAction) { a.Spec.Cache.Version = "" }, "an enabled cache needs a version"},
		{"overwrite without the cache", func(a *flytev1.TaskAction) { a.Spec.Cache.Enabled, a.Spec.Cache.Overwrite = false, true }, "overwrite writes the cache: it needs enabled"},
		{"zero timeout", func(a *flytev1.TaskAction) { a.Spec.Timeout = &metav1.Duration{} }, "timeout must be positive"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ta := sample(t, ns)
			ta.Name = "invalid-" + string(rune('a'+i))
			tt.mutate(ta)
			err := env.Client.Create(ctx(t), ta)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v; want Invalid mentioning %q", err, tt.want)
			}
		})
	}
}

func TestSpecIsImmutable(t *testing.T) {
	ta := createSample(t)
	changed := ta.DeepCopy()
	changed.Spec.Retries = 3
	if err := env.Client.Update(ctx(t), changed); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec is immutable") {
		t.Fatalf("changing the spec: %v; want Invalid: spec is immutable", err)
	}
	// Metadata stays editable: the executor puts its finalizer on, and people label.
	labeled := ta.DeepCopy()
	labeled.Labels = map[string]string{"team": "data"}
	if err := env.Client.Update(ctx(t), labeled); err != nil {
		t.Fatalf("labeling: %v", err)
	}
}

func TestStatus(t *testing.T) {
	ta := createSample(t)
	now := metav1.Now()
	micro := metav1.NewMicroTime(now.Time)
	ta.Status = flytev1.TaskActionStatus{
		Phase:    flytev1.PhaseRunning,
		Attempts: 1,
		PhaseHistory: []flytev1.PhaseTransition{
			{Phase: flytev1.PhaseQueued, Attempt: 1, OccurredAt: micro},
			{Phase: flytev1.PhaseRunning, Attempt: 1, OccurredAt: micro},
		},
		Conditions: []metav1.Condition{{Type: flytev1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: flytev1.ReasonRunning, LastTransitionTime: now}},
	}
	if err := env.Client.Status().Update(ctx(t), ta); err != nil {
		t.Fatalf("status update: %v", err)
	}

	shrunk := ta.DeepCopy()
	shrunk.Status.PhaseHistory = shrunk.Status.PhaseHistory[:1]
	if err := env.Client.Status().Update(ctx(t), shrunk); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "phaseHistory is append-only") {
		t.Fatalf("shrinking the history: %v; want Invalid", err)
	}
	bad := ta.DeepCopy()
	bad.Status.Phase = "Sleeping"
	if err := env.Client.Status().Update(ctx(t), bad); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "status.phase") {
		t.Fatalf("an unknown phase: %v; want Invalid", err)
	}
}

func TestPrinterColumns(t *testing.T) {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := env.Client.Get(ctx(t), client.ObjectKey{Name: "taskactions.flyte.org"}, &crd); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range crd.Spec.Versions[0].AdditionalPrinterColumns {
		names = append(names, c.Name)
	}
	if got := strings.Join(names, ","); got != "Run,Action,Type,Phase,Attempts,Age" {
		t.Fatalf("printer columns %s", got)
	}
	if crd.Spec.Versions[0].Subresources == nil || crd.Spec.Versions[0].Subresources.Status == nil {
		t.Fatal("no status subresource")
	}
}

func TestIsTerminal(t *testing.T) {
	terminal := map[flytev1.Phase]bool{
		flytev1.PhaseQueued: false, flytev1.PhaseWaitingForResources: false, flytev1.PhaseInitializing: false,
		flytev1.PhaseRunning: false, flytev1.PhaseSucceeded: true, flytev1.PhaseFailed: true,
		flytev1.PhaseAborted: true, flytev1.PhaseTimedOut: true,
		"": false, "Sleeping": false,
	}
	for phase, want := range terminal {
		if phase.IsTerminal() != want {
			t.Errorf("%q.IsTerminal() = %v", phase, !want)
		}
	}
	for _, phase := range flytev1.Phases() {
		if _, ok := terminal[phase]; !ok {
			t.Errorf("phase %s is not in the table", phase)
		}
	}
}
