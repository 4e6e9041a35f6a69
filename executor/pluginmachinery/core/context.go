package core

import (
	"context"
	"errors"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/storage"
)

// TaskExecutionContext is what a plugin gets for one attempt of one action.
type TaskExecutionContext interface {
	// Metadata describes the action and the attempt.
	Metadata() TaskExecutionMetadata
	// DataStore reads and writes blobs (file://, mem://, s3://, gs://).
	DataStore() storage.DataStore
	// InputReader reads the action's inputs.
	InputReader() InputReader
	// OutputWriter writes the attempt's outputs.
	OutputWriter() OutputWriter
	// SecretManager reads secrets the task may use.
	SecretManager() SecretManager
	// PluginStateReader reads what the plugin kept from earlier calls of this attempt.
	PluginStateReader() PluginStateReader
	// PluginStateWriter keeps state for later calls of this attempt.
	PluginStateWriter() PluginStateWriter
}

// TaskExecutionMetadata describes the action and the attempt being executed.
type TaskExecutionMetadata interface {
	// Action is the TaskAction; plugins must not modify it.
	Action() *flytev1.TaskAction
	// Attempt is the attempt's number, from 1. Every relaunch has a new one.
	Attempt() int32
	// ObjectName names objects of this attempt: unique per action and attempt, and a
	// valid Kubernetes name.
	ObjectName() string
	// OwnerReference points at the TaskAction, for objects the attempt creates.
	OwnerReference() metav1.OwnerReference
	// ServiceAccountName is the action's, else the executor's default, else empty (the
	// namespace's default applies).
	ServiceAccountName() string
	// Labels identify the action's objects (managed-by, action identity, attempt).
	Labels() map[string]string
	// Now is the reconciler's clock, so that tests control time.
	Now() time.Time
	// IsInterruptible says the attempt may run on preemptible capacity: the action asks
	// for it (spec.interruptible) and has not had so many system failures that
	// k8s.interruptibleFailureThreshold moves it to on-demand capacity.
	IsInterruptible() bool
}

// InputReader reads an action's inputs.
type InputReader interface {
	// InputURI is where the inputs are; empty when the action has none.
	InputURI() string
	// Read returns the inputs document; nil when the action has none. It is read with
	// the data store's limit (see storage.DataStore.Read).
	Read(ctx context.Context) ([]byte, error)
}

// OutputWriter writes an attempt's outputs.
type OutputWriter interface {
	// OutputPrefix is where the attempt writes: unique per action and attempt.
	OutputPrefix() string
	// OutputsURI is where the outputs document goes.
	OutputsURI() string
	// ErrorURI is where a task writes its error document to report a user error.
	ErrorURI() string
	// Write stores the outputs document and returns its URI.
	Write(ctx context.Context, outputs []byte) (string, error)
}

// SecretManager reads the executor's own secrets, such as a plugin's credentials for an
// external service. It never reads an action's: those are rendered into the action's
// pod as references (spec.secrets), and the kubelet fetches them.
type SecretManager interface {
	// Get returns a key of a secret in the executor's own namespace (executorNamespace).
	Get(ctx context.Context, name, key string) ([]byte, error)
}

// ErrUnreadableState is returned when a plugin's stored state does not decode, for
// example after an incompatible change of the plugin.
var ErrUnreadableState = errors.New("plugin state cannot be read")

// PluginStateReader reads a plugin's state.
type PluginStateReader interface {
	// Version is the format version of the stored state; 0 when there is none.
	Version() int32
	// Get decodes the state into v and returns its version; 0 and no error when there is
	// none. A state that does not decode is ErrUnreadableState.
	Get(v any) (int32, error)
}

// PluginStateWriter keeps a plugin's state.
type PluginStateWriter interface {
	// Put stores v (encoded as JSON) with its format version; it is saved with the
	// attempt's status.
	Put(version int32, v any) error
	// Reset forgets the state, as for a new attempt.
	Reset() error
}
