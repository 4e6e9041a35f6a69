// Package storage is the contract of the data store that actions' inputs and outputs go
// through: the interfaces a store implements (package datastore is the executor's), the
// errors it returns and the checks a caller may make before it reads or writes. Plugins,
// the plugin machinery, the controller and the cache client use a store through this
// package alone, so recognising an error never means importing the implementation.
package storage

import (
	"context"
	"errors"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

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

// ActionScopedDataStore is a DataStore that confines each action to the locations it
// may use, such as the executor's (datastore.Confined).
type ActionScopedDataStore interface {
	DataStore
	// ForAction is the part of the store the action may read and write.
	ForAction(action *flytev1.TaskAction) DataStore
}

// DataStoreFor is what an action may use of store: the action's own view when the store
// confines actions, else the store itself.
func DataStoreFor(store DataStore, action *flytev1.TaskAction) DataStore {
	if scoped, ok := store.(ActionScopedDataStore); ok {
		return scoped.ForAction(action)
	}
	return store
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
