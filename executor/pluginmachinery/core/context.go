package core

import (
	"context"
	"errors"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// TaskExecutionContext is what a plugin gets for one attempt of one action.
type TaskExecutionContext interface {
	// Metadata describes the action and the attempt.
	Metadata() TaskExecutionMetadata
	// DataStore reads and writes blobs (file://, mem://, s3://, gs://).
	DataStore() DataStore
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

// DataStore reads and writes blobs by URI.
type DataStore interface {
	// Read returns a blob's content; errors.Is(err, ErrNotFound) when it does not exist,
	// errors.Is(err, ErrTooLarge) when it is larger than the store reads into memory.
	Read(ctx context.Context, uri string) ([]byte, error)
	// Write stores content at uri, replacing what is there.
	Write(ctx context.Context, uri string, content []byte) error
	// Exists reports whether a blob exists.
	Exists(ctx context.Context, uri string) (bool, error)
}

// Sizer is a DataStore that tells a blob's size without reading it; errors.Is(err,
// ErrNotFound) when it does not exist. The cache counts outputs' sizes through it.
type Sizer interface {
	Size(ctx context.Context, uri string) (int64, error)
}

// Copier is a DataStore that copies a blob without holding it in memory, streamed;
// errors.Is(err, ErrNotFound) when from does not exist, errors.Is(err, ErrTooLarge) when
// it is larger than the store copies. Cached outputs and echoed inputs are copied
// through it.
type Copier interface {
	Copy(ctx context.Context, from, to string) error
}

// HostPathStore is a DataStore whose file:// objects lie on this machine's disk, where a
// pod on the same machine can mount them: a single-node cluster whose executor runs on
// the node. The kubelet makes a mount later than any check, following symbolic links, so
// a pod never mounts a path of the data store itself: it mounts its attempt's staging
// directory, which no pod can write, and what it wrote is moved to its URI once it has
// stopped (see package datastore). Every method refuses what the action may not use, as
// Read and Write do. attempt names the attempt uniquely: the action's UID and number.
type HostPathStore interface {
	// StageInput copies the file at uri, a file:// object the action may read, into the
	// attempt's staging directory, for the pod to mount read-only: a copy, never a link,
	// so that no pod can change the stored object through its mount.
	StageInput(ctx context.Context, uri, attempt string) (HostMount, error)
	// StageOutput creates the attempt's staged output directory for uri, a file://
	// location the action may write under, for the pod to mount read-write: the only
	// place it can write.
	StageOutput(ctx context.Context, uri, attempt string) (HostMount, error)
	// CollectOutput moves what the attempt's pod wrote into its staged output directory
	// to uri, regular files and directories only, and must be called only once the pod
	// has stopped. Calling it again moves nothing more. A tree over the store's bounds
	// (entries, depth) is not moved: errors.Is(err, ErrTooLarge).
	CollectOutput(ctx context.Context, uri, attempt string) error
	// Unstage removes what was staged for the attempt under uri's prefix, collected or
	// not.
	Unstage(ctx context.Context, uri, attempt string) error
}

// HostMount is a host path to mount into a pod, and where the task expects it.
type HostMount struct {
	// Source is the path on the host, in the attempt's staging directory.
	Source string
	// Target is the path the URI names, where the task reads or writes.
	Target string
}

// ErrNotFound is returned by DataStore.Read for a missing blob.
var ErrNotFound = errors.New("blob not found")

// ErrTooLarge is returned (wrapped, with the object and the limit named) for a blob or an
// output tree over the data store's limits. What a task wrote decides it, so retrying
// cannot help: the action fails as a user error.
var ErrTooLarge = errors.New("over the data store's limit")

// InputReader reads an action's inputs.
type InputReader interface {
	// InputURI is where the inputs are; empty when the action has none.
	InputURI() string
	// Read returns the inputs document; nil when the action has none. It is read with
	// the data store's limit (see DataStore.Read).
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
