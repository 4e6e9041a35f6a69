package core_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
)

// fake is a plugin that does nothing; its ID tells which one resolved.
type fake struct{ id string }

func (f fake) GetID() string                  { return f.id }
func (f fake) GetProperties() core.Properties { return core.Properties{} }
func (f fake) Handle(context.Context, core.TaskExecutionContext) (core.Transition, error) {
	return core.Transition{}, nil
}
func (f fake) Abort(context.Context, core.TaskExecutionContext) error    { return nil }
func (f fake) Finalize(context.Context, core.TaskExecutionContext) error { return nil }

func entry(id string, isDefault bool, types ...string) core.Entry {
	return core.Entry{ID: id, RegisteredTaskTypes: types, IsDefault: isDefault,
		LoadPlugin: func(context.Context, core.SetupContext) (core.Plugin, error) { return fake{id}, nil }}
}

func TestResolve(t *testing.T) {
	tests := []struct {
		name      string
		entries   []core.Entry
		overrides map[string]string
		taskType  string
		want      string // plugin ID, or "" for ErrUnknownTaskType
		warning   string
	}{
		{name: "registered type", entries: []core.Entry{entry("sleep", false, "core-sleep")}, taskType: "core-sleep", want: "sleep"},
		{name: "unknown type without a default", entries: []core.Entry{entry("sleep", false, "core-sleep")}, taskType: "spark"},
		{name: "unknown type goes to the default", entries: []core.Entry{entry("container", true, "container"), entry("sleep", false, "core-sleep")}, taskType: "python-task", want: "container"},
		{name: "a registered type beats the default", entries: []core.Entry{entry("container", true, "container"), entry("sleep", false, "core-sleep")}, taskType: "core-sleep", want: "sleep"},
		{name: "collision: the later one wins, with a warning", entries: []core.Entry{entry("a", false, "x"), entry("b", false, "x")}, taskType: "x", want: "b", warning: "task type registered by two plugins"},
		{name: "two defaults: the later one wins, with a warning", entries: []core.Entry{entry("a", true), entry("b", true)}, taskType: "x", want: "b", warning: "two default plugins"},
		{name: "defaultForTaskTypes overrides a registration", entries: []core.Entry{entry("container", true, "container"), entry("echo", false, "core-echo")}, overrides: map[string]string{"core-echo": "container"}, taskType: "core-echo", want: "container"},
		{name: "defaultForTaskTypes maps a new type", entries: []core.Entry{entry("echo", false, "core-echo")}, overrides: map[string]string{"python-task": "echo"}, taskType: "python-task", want: "echo"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			r := core.NewRegistry(slog.New(slog.NewTextHandler(&logs, nil)))
			for _, e := range tt.entries {
				if err := r.Register(e); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.Initialize(context.Background(), nil, tt.overrides); err != nil {
				t.Fatal(err)
			}
			p, err := r.Resolve(tt.taskType)
			switch {
			case tt.want == "" && !errors.Is(err, core.ErrUnknownTaskType):
				t.Fatalf("Resolve(%q) = %v, %v; want ErrUnknownTaskType", tt.taskType, p, err)
			case tt.want != "" && (err != nil || p.GetID() != tt.want):
				t.Fatalf("Resolve(%q) = %v, %v; want %s", tt.taskType, p, err, tt.want)
			}
			if !strings.Contains(logs.String(), tt.warning) {
				t.Fatalf("logs %q lack %q", logs.String(), tt.warning)
			}
		})
	}
}

func TestRegistryErrors(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name     string
		register []core.Entry
		init     map[string]string
		want     string
	}{
		{name: "no ID", register: []core.Entry{entry("", false, "x")}, want: "needs an ID"},
		{name: "no loader", register: []core.Entry{{ID: "a", RegisteredTaskTypes: []string{"x"}}}, want: "needs LoadPlugin"},
		{name: "no task types", register: []core.Entry{entry("a", false)}, want: "needs task types"},
		{name: "same ID twice", register: []core.Entry{entry("a", false, "x"), entry("a", false, "y")}, want: "registered twice"},
		{name: "loader fails", register: []core.Entry{{ID: "a", RegisteredTaskTypes: []string{"x"},
			LoadPlugin: func(context.Context, core.SetupContext) (core.Plugin, error) { return nil, boom }}}, want: "plugin a: loading: boom"},
		{name: "override names an unknown plugin", register: []core.Entry{entry("a", false, "x")}, init: map[string]string{"y": "nope"}, want: `defaultForTaskTypes: task type "y" names plugin "nope"`},
		{name: "a plugin declaring its watched kind itself", register: []core.Entry{{ID: "a", RegisteredTaskTypes: []string{"x"},
			LoadPlugin: func(context.Context, core.SetupContext) (core.Plugin, error) { return selfWatching{fake{"a"}}, nil }}},
			want: "plugin a: declares the kind it watches with a ResourceToWatch method"},
		{name: "a plugin declaring its watched kind itself and on its entry", register: []core.Entry{{ID: "a", RegisteredTaskTypes: []string{"x"},
			Watches:    &corev1.Pod{},
			LoadPlugin: func(context.Context, core.SetupContext) (core.Plugin, error) { return selfWatching{fake{"a"}}, nil }}},
			want: "set Entry.Watches"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := core.NewRegistry(slog.New(slog.DiscardHandler))
			var err error
			for _, e := range tt.register {
				if err = r.Register(e); err != nil {
					break
				}
			}
			if err == nil {
				err = r.Initialize(context.Background(), nil, tt.init)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v; want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestResolveBeforeInitialize(t *testing.T) {
	if _, err := core.NewRegistry(nil).Resolve("x"); err == nil {
		t.Fatal("Resolve worked before Initialize")
	}
}

// selfWatching declares the kind it watches on itself, which the registry refuses.
type selfWatching struct{ fake }

func (selfWatching) ResourceToWatch() client.Object { return &corev1.Pod{} }

// TestWatches: the kinds entries watch, each once, known before the plugins are loaded
// (the manager's cache is configured from them first).
func TestWatches(t *testing.T) {
	watching := func(id string, obj client.Object) core.Entry {
		e := entry(id, false, id)
		e.Watches = obj
		return e
	}
	tests := []struct {
		name    string
		entries []core.Entry
		want    []string
	}{
		{"none", []core.Entry{entry("a", false, "a")}, nil},
		{"one kind", []core.Entry{entry("a", false, "a"), watching("b", &corev1.Pod{})}, []string{"*v1.Pod"}},
		{"a kind two plugins watch, once", []core.Entry{watching("a", &corev1.Pod{}), watching("b", &batchv1.Job{}), watching("c", &corev1.Pod{})},
			[]string{"*v1.Pod", "*v1.Job"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := core.NewRegistry(slog.New(slog.DiscardHandler))
			for _, e := range tt.entries {
				if err := r.Register(e); err != nil {
					t.Fatal(err)
				}
			}
			var got []string
			for _, obj := range r.Watches() {
				got = append(got, fmt.Sprintf("%T", obj))
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Watches() = %v; want %v", got, tt.want)
			}
		})
	}
}
