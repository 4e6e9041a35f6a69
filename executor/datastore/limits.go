package datastore

import (
	"fmt"
	"github.com/flytekube/backend/executor/storage"
	"time"
)

// Limits bound what the data store spends on data a task controls: a task chooses how
// large the objects it leaves are (a sparse file costs it nothing), how many files its
// output holds and how deep, and a store may stall. None of it may cost the executor
// more than these, whatever the task did. The settings are storage.* (executor/config).
type Limits struct {
	// MaxDocumentBytes bounds an object Read returns, which is held in memory whole:
	// error documents, inputs documents (the cache hashes them).
	MaxDocumentBytes int64
	// MaxCopyBytes bounds an object Copy and StageInput copy, streamed (memory stays
	// flat); it bounds the disk and the time a copy spends.
	MaxCopyBytes int64
	// CallTimeout is the deadline of one call of the store (a read, a write, an
	// attribute lookup, opening a bucket).
	CallTimeout time.Duration
	// CopyTimeout is the deadline of one copy, which moves up to MaxCopyBytes.
	CopyTimeout time.Duration
	// MaxOutputEntries and MaxOutputDepth bound the tree CollectOutput moves: the
	// entries of every directory in all, and how many directories deep it nests.
	MaxOutputEntries int
	MaxOutputDepth   int
}

// The settings that hold the limits, named in errors so that whoever reads one knows
// what bound was met and where it is set.
const (
	SettingMaxDocumentBytes = "storage.maxDocumentBytes"
	SettingMaxCopyBytes     = "storage.maxCopyBytes"
	SettingMaxOutputEntries = "storage.maxOutputEntries"
	SettingMaxOutputDepth   = "storage.maxOutputDepth"
)

// DefaultLimits are the defaults of executor/config, for stores made without a
// configuration (tools and tests); docs/configuration.md says why each is what it is.
func DefaultLimits() Limits {
	return Limits{
		MaxDocumentBytes: 2 << 20,
		MaxCopyBytes:     1 << 30,
		CallTimeout:      30 * time.Second,
		CopyTimeout:      5 * time.Minute,
		MaxOutputEntries: 10_000,
		MaxOutputDepth:   32,
	}
}

// orDefaults fills the limits left zero with the defaults.
func (l Limits) orDefaults() Limits {
	d := DefaultLimits()
	if l.MaxDocumentBytes <= 0 {
		l.MaxDocumentBytes = d.MaxDocumentBytes
	}
	if l.MaxCopyBytes <= 0 {
		l.MaxCopyBytes = d.MaxCopyBytes
	}
	if l.CallTimeout <= 0 {
		l.CallTimeout = d.CallTimeout
	}
	if l.CopyTimeout <= 0 {
		l.CopyTimeout = d.CopyTimeout
	}
	if l.MaxOutputEntries <= 0 {
		l.MaxOutputEntries = d.MaxOutputEntries
	}
	if l.MaxOutputDepth <= 0 {
		l.MaxOutputDepth = d.MaxOutputDepth
	}
	return l
}

// TooLargeError says that an object or an output tree is over one of the Limits. What
// was over it is the task's doing, so retrying cannot help: the callers fail the
// action as a user error, with this message. errors.Is(err, storage.ErrTooLarge) holds.
type TooLargeError struct {
	// URI is the object, or the output location of a tree.
	URI string
	// Size is the object's size in bytes when known, else -1 (trees: -1).
	Size int64
	// Limit is the bound met, in the unit of Setting.
	Limit int64
	// Setting names the bound (one of the Setting* constants).
	Setting string
}

func (e *TooLargeError) Error() string {
	switch e.Setting {
	case SettingMaxOutputEntries:
		return fmt.Sprintf("datastore: the outputs at %s hold more than %d files and directories, the limit of %s", e.URI, e.Limit, e.Setting)
	case SettingMaxOutputDepth:
		return fmt.Sprintf("datastore: the outputs at %s nest directories deeper than %d, the limit of %s", e.URI, e.Limit, e.Setting)
	}
	if e.Size >= 0 {
		return fmt.Sprintf("datastore: %s is %d bytes, over the limit of %d bytes of %s", e.URI, e.Size, e.Limit, e.Setting)
	}
	return fmt.Sprintf("datastore: %s is over the limit of %d bytes of %s", e.URI, e.Limit, e.Setting)
}

// Is makes errors.Is(err, storage.ErrTooLarge) hold.
func (e *TooLargeError) Is(target error) bool { return target == storage.ErrTooLarge }

func tooLarge(uri string, size, limit int64, setting string) error {
	return &TooLargeError{URI: uri, Size: size, Limit: limit, Setting: setting}
}
