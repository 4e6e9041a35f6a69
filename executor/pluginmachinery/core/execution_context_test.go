package core_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
)

func action() *flytev1.TaskAction {
	return &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: "r1-a0", Namespace: "demo", UID: "uid-1"},
		Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "r1", ActionName: "a0",
			TaskName: "demo.echo", TaskType: "core-echo", InputURI: "mem://b/r1/inputs.json", RunOutputBase: "mem://b/r1/"},
	}
}

func TestExecutionContext(t *testing.T) {
	ctx := context.Background()
	store := datastore.New()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	ta := action()
	tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{
		Action: ta, Attempt: 2, DefaultServiceAccount: "flyte-tasks", DataStore: store,
		Clock: func() time.Time { return now },
	})

	md := tCtx.Metadata()
	if md.ObjectName() != "r1-a0-2" || md.Attempt() != 2 || !md.Now().Equal(now) {
		t.Fatalf("metadata: %s, %d, %s", md.ObjectName(), md.Attempt(), md.Now())
	}
	if md.ServiceAccountName() != "flyte-tasks" {
		t.Fatalf("service account %q; want the default", md.ServiceAccountName())
	}
	ta.Spec.ServiceAccountName = "own"
	if md.ServiceAccountName() != "own" {
		t.Fatalf("service account %q; want the action's own", md.ServiceAccountName())
	}
	if ref := md.OwnerReference(); ref.Kind != "TaskAction" || ref.UID != "uid-1" || ref.Controller == nil || !*ref.Controller {
		t.Fatalf("owner reference %+v", ref)
	}
	if l := md.Labels(); l[core.LabelAttempt] != "2" || l[core.LabelRun] != "r1" || l[core.LabelManagedBy] != core.ManagedByValue {
		t.Fatalf("labels %v", l)
	}

	out := tCtx.OutputWriter()
	if out.OutputPrefix() != "mem://b/r1/a0/2" || out.OutputsURI() != "mem://b/r1/a0/2/outputs.json" || out.ErrorURI() != "mem://b/r1/a0/2/error.json" {
		t.Fatalf("outputs at %s, %s, %s", out.OutputPrefix(), out.OutputsURI(), out.ErrorURI())
	}
	if err := store.Write(ctx, "mem://b/r1/inputs.json", []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if in, err := tCtx.InputReader().Read(ctx); err != nil || string(in) != `{"a":1}` {
		t.Fatalf("inputs %q, %v", in, err)
	}

	// Plugin state: none at first, then versioned JSON in the status, unreadable junk named as such.
	var st struct{ Started time.Time }
	if v, err := tCtx.PluginStateReader().Get(&st); v != 0 || err != nil {
		t.Fatalf("empty state: %d, %v", v, err)
	}
	st.Started = now
	if err := tCtx.PluginStateWriter().Put(3, st); err != nil {
		t.Fatal(err)
	}
	if ta.Status.PluginState == nil || ta.Status.PluginState.Version != 3 {
		t.Fatalf("state not in the status: %+v", ta.Status.PluginState)
	}
	var back struct{ Started time.Time }
	if v, err := tCtx.PluginStateReader().Get(&back); v != 3 || err != nil || !back.Started.Equal(now) {
		t.Fatalf("state read back: %d, %v, %v", v, err, back)
	}
	ta.Status.PluginState.Data = []byte("not json")
	if _, err := tCtx.PluginStateReader().Get(&back); !errors.Is(err, core.ErrUnreadableState) {
		t.Fatalf("junk state: %v; want ErrUnreadableState", err)
	}
	if err := tCtx.PluginStateWriter().Reset(); err != nil || ta.Status.PluginState != nil {
		t.Fatalf("reset: %v, %+v", err, ta.Status.PluginState)
	}
}

func TestAttemptObjectName(t *testing.T) {
	long := strings.Repeat("a", 70)
	tests := []struct {
		name    string
		attempt int32
		want    string
	}{
		{"r1-a0", 1, "r1-a0-1"},
		{"r1-a0", 12, "r1-a0-12"},
		// Running attempts' objects are found by these names: the hash (32-bit FNV-1a of
		// the whole name) must not change between releases.
		{long, 3, strings.Repeat("a", 52) + "-5904740b-3"},
		{"r1-" + strings.Repeat("a", 60) + ".train-" + strings.Repeat("b", 40), 3, "r1-" + strings.Repeat("a", 49) + "-f537f07a-3"},
	}
	for _, tt := range tests {
		if got := core.AttemptObjectName(tt.name, tt.attempt); got != tt.want {
			t.Errorf("AttemptObjectName(%q, %d) = %q; want %q", tt.name, tt.attempt, got, tt.want)
		}
	}
	a, b := core.AttemptObjectName(long, 1), core.AttemptObjectName(long+"b", 1)
	if len(a) > 63 || len(b) > 63 || a == b || !strings.HasSuffix(a, "-1") {
		t.Fatalf("long names %q and %q must be distinct, within 63, and end with the attempt", a, b)
	}
}

func TestTaskActionLabelValue(t *testing.T) {
	a63 := strings.Repeat("a", 63)
	tests := []struct {
		name string
		keep bool // the name itself is the value
	}{
		{"r1-a0", true},
		{a63, true},
		{a63 + "b", false},
		{"r1-" + strings.Repeat("a", 60) + ".train-" + strings.Repeat("b", 40), false},
		{strings.Repeat("a", 53) + "---------.x", false}, // the cut lands on separators
		{strings.Repeat("x", 253), false},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		got := core.TaskActionLabelValue(tt.name)
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
			t.Errorf("TaskActionLabelValue(%q) = %q: %v", tt.name, got, errs)
		}
		if (got == tt.name) != tt.keep {
			t.Errorf("TaskActionLabelValue(%q) = %q; keep the name: %v", tt.name, got, tt.keep)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("%q and %q share the value %q", other, tt.name, got)
		}
		seen[got] = tt.name
	}
}

// A task's name becomes a label value so that pod metrics join to tasks: characters a
// label may not hold become '_', and a long name is cut with a hash, as other names are.
func TestTaskLabelValue(t *testing.T) {
	tests := []struct {
		name, want string
	}{
		{"my.module.train", "my.module.train"},
		{"my.module:train", "my.module_train"},
		{"team/pipelines/train", "team_pipelines_train"},
		{"_private.task", "private.task"},
		{"train:", "train"},
		{"pkg." + strings.Repeat("t", 251), ""},
		{"a::" + strings.Repeat("t", 252), ""},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		got := core.TaskLabelValue(tt.name)
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 || got == "" {
			t.Errorf("TaskLabelValue(%q) = %q: %v", tt.name, got, errs)
		}
		if tt.want != "" && got != tt.want {
			t.Errorf("TaskLabelValue(%q) = %q; want %q", tt.name, got, tt.want)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("%q and %q share the value %q", other, tt.name, got)
		}
		seen[got] = tt.name
	}
}
