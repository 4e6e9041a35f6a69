package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/storage"
)

// Labels the executor puts on every object it creates for an action.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "flyte-executor"
	LabelProject   = "flyte.org/project"
	LabelDomain    = "flyte.org/domain"
	LabelRun       = "flyte.org/run"
	LabelAction    = "flyte.org/action"
	LabelAttempt   = "flyte.org/attempt"
	// LabelTask is the task's name, as TaskLabelValue makes it a label value, so that
	// metrics of pods (kube_pod_*) join to the tasks they ran.
	LabelTask = "flyte.org/task"
	// LabelTaskAction names the owning TaskAction, so its objects can be listed.
	LabelTaskAction = "flyte.org/task-action"
	// LabelTaskActionUID ties an object to the TaskAction incarnation that made it, so
	// that an object left by an earlier action of the same name is never adopted, and so
	// that an object without an owner reference still finds its action.
	LabelTaskActionUID = "flyte.org/task-action-uid"
)

// ExecutionContextOptions build a TaskExecutionContext for one attempt.
type ExecutionContextOptions struct {
	// Action is the TaskAction; its Status.PluginState is read and written in place.
	Action *flytev1.TaskAction
	// Attempt is the attempt's number, from 1.
	Attempt int32
	// DefaultServiceAccount applies when the action names none.
	DefaultServiceAccount string
	DataStore             storage.DataStore
	// Secrets reads Secrets in SecretsNamespace, the executor's own namespace; empty
	// means none, and SecretManager refuses.
	Secrets          client.Reader
	SecretsNamespace string
	// Clock returns now; time.Now when nil.
	Clock func() time.Time
	// Interruptible decides whether the attempt of an action with spec.interruptible
	// runs on preemptible capacity; the zero policy: always.
	Interruptible InterruptiblePolicy
}

// NewTaskExecutionContext builds the context a plugin gets for one attempt. Its data
// store, inputs and outputs are the action's view of o.DataStore (see storage.DataStoreFor).
func NewTaskExecutionContext(o ExecutionContextOptions) TaskExecutionContext {
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.DataStore != nil {
		o.DataStore = storage.DataStoreFor(o.DataStore, o.Action)
	}
	return &executionContext{o: o, state: &pluginState{status: &o.Action.Status}}
}

type executionContext struct {
	o     ExecutionContextOptions
	state *pluginState
}

func (c *executionContext) Metadata() TaskExecutionMetadata      { return metadata{c.o} }
func (c *executionContext) DataStore() storage.DataStore         { return c.o.DataStore }
func (c *executionContext) InputReader() InputReader             { return inputs{c.o} }
func (c *executionContext) OutputWriter() OutputWriter           { return outputs{c.o} }
func (c *executionContext) SecretManager() SecretManager         { return secrets{c.o} }
func (c *executionContext) PluginStateReader() PluginStateReader { return c.state }
func (c *executionContext) PluginStateWriter() PluginStateWriter { return c.state }

type metadata struct{ o ExecutionContextOptions }

func (m metadata) Action() *flytev1.TaskAction { return m.o.Action }
func (m metadata) Attempt() int32              { return m.o.Attempt }
func (m metadata) Now() time.Time              { return m.o.Clock() }

func (m metadata) IsInterruptible() bool {
	interruptible, _ := m.o.Interruptible.Decide(m.o.Action)
	return interruptible
}

// ObjectName is "<action object name>-<attempt>", shortened with a hash of the full
// name when that would exceed a DNS label, so that it stays unique per attempt.
func (m metadata) ObjectName() string {
	return AttemptObjectName(m.o.Action.Name, m.o.Attempt)
}

func (m metadata) OwnerReference() metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         flytev1.GroupVersion.String(),
		Kind:               "TaskAction",
		Name:               m.o.Action.Name,
		UID:                m.o.Action.UID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}
}

func (m metadata) ServiceAccountName() string {
	if sa := m.o.Action.Spec.ServiceAccountName; sa != "" {
		return sa
	}
	return m.o.DefaultServiceAccount
}

func (m metadata) Labels() map[string]string {
	s := m.o.Action.Spec
	return map[string]string{
		LabelManagedBy: ManagedByValue, LabelProject: s.Project, LabelDomain: s.Domain,
		LabelRun: s.RunName, LabelAction: s.ActionName, LabelAttempt: strconv.Itoa(int(m.o.Attempt)),
		LabelTaskAction: TaskActionLabelValue(m.o.Action.Name), LabelTask: TaskLabelValue(s.TaskName),
	}
}

// TaskLabelValue is the LabelTask value of a task name: characters a label value may not
// hold (the ':' and '/' a task name may) become '_', separators are trimmed from either
// end, and a name longer than 63 is shortened with a hash of the whole, as
// AttemptObjectName does.
func TaskLabelValue(name string) string {
	v := strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, name)
	v = strings.Trim(v, "-_.")
	if len(v) > 63 {
		v = strings.TrimRight(shorten(v, 63), "-_.")
	}
	return v
}

// TaskActionLabelValue is the LabelTaskAction value of a TaskAction's objects: its name,
// or, for names longer than a label value may be (63 characters), the name shortened
// with a hash of the whole, as AttemptObjectName does.
func TaskActionLabelValue(name string) string {
	if len(name) <= 63 {
		return name
	}
	return shorten(name, 63)
}

// AttemptObjectName names an attempt's objects: "<name>-<attempt>", within 63
// characters.
func AttemptObjectName(name string, attempt int32) string {
	suffix := "-" + strconv.Itoa(int(attempt))
	if len(name)+len(suffix) <= 63 {
		return name + suffix
	}
	return shorten(name, 63-len(suffix)) + suffix
}

// shorten fits a name longer than limit into limit characters: a prefix, then '-' and a
// hash of the whole name, so that different long names stay different.
func shorten(name string, limit int) string {
	keep := limit - 9
	return strings.TrimRight(name[:keep], "-._") + "-" + fnv32(name)
}

// fnv32 is the 32-bit FNV-1a hash of s, in hex.
func fnv32(s string) string {
	h := fnv.New32a()
	_, _ = io.WriteString(h, s) // a hash never fails to write
	return fmt.Sprintf("%08x", h.Sum32())
}

type inputs struct{ o ExecutionContextOptions }

func (i inputs) InputURI() string { return i.o.Action.Spec.InputURI }

func (i inputs) Read(ctx context.Context) ([]byte, error) {
	if i.InputURI() == "" {
		return nil, nil
	}
	return i.o.DataStore.Read(ctx, i.InputURI())
}

type outputs struct{ o ExecutionContextOptions }

// OutputPrefix is "<runOutputBase>/<action>/<attempt>": every attempt writes apart, so a
// late writer of an old attempt cannot clobber the new one's outputs.
func (w outputs) OutputPrefix() string {
	return strings.TrimRight(w.o.Action.Spec.RunOutputBase, "/") + "/" + w.o.Action.Spec.ActionName + "/" + strconv.Itoa(int(w.o.Attempt))
}

func (w outputs) OutputsURI() string { return w.OutputPrefix() + "/outputs.json" }
func (w outputs) ErrorURI() string   { return w.OutputPrefix() + "/error.json" }

func (w outputs) Write(ctx context.Context, content []byte) (string, error) {
	if err := w.o.DataStore.Write(ctx, w.OutputsURI(), content); err != nil {
		return "", err
	}
	return w.OutputsURI(), nil
}

type secrets struct{ o ExecutionContextOptions }

func (s secrets) Get(ctx context.Context, name, key string) ([]byte, error) {
	if s.o.Secrets == nil || s.o.SecretsNamespace == "" {
		return nil, errors.New("plugin: the executor has no namespace of its own to read secrets in (executorNamespace)")
	}
	ns := s.o.SecretsNamespace
	var secret corev1.Secret
	if err := s.o.Secrets.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &secret); err != nil {
		return nil, fmt.Errorf("plugin: reading secret %s/%s: %w", ns, name, err)
	}
	v, ok := secret.Data[key]
	if !ok {
		return nil, fmt.Errorf("plugin: secret %s/%s has no key %q", ns, name, key)
	}
	return v, nil
}

// pluginState keeps a plugin's state in the action's status, as versioned JSON.
type pluginState struct{ status *flytev1.TaskActionStatus }

func (p *pluginState) Version() int32 {
	if p.status.PluginState == nil {
		return 0
	}
	return p.status.PluginState.Version
}

func (p *pluginState) Get(v any) (int32, error) {
	st := p.status.PluginState
	if st == nil || len(st.Data) == 0 {
		return 0, nil
	}
	if err := json.Unmarshal(st.Data, v); err != nil {
		return st.Version, fmt.Errorf("%w (version %d): %v", ErrUnreadableState, st.Version, err)
	}
	return st.Version, nil
}

func (p *pluginState) Put(version int32, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("plugin: encoding state: %w", err)
	}
	p.status.PluginState = &flytev1.PluginState{Version: version, Data: data}
	return nil
}

func (p *pluginState) Reset() error {
	p.status.PluginState = nil
	return nil
}
