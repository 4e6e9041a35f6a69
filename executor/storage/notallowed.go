package storage

import (
	"errors"
	"fmt"
)

// ErrNotAllowed is returned (as a *NotAllowedError) for a URI outside the locations a
// confined store, or an action's view of it, may use. Nothing was read or written.
var ErrNotAllowed = errors.New("outside the locations the data store may use")

// Reasons a URI is refused, as NotAllowedError.Reason; they label metrics.
const (
	// ReasonOutside: under no allowed prefix, or not a URI one could hold.
	ReasonOutside = "outside"
	// ReasonOtherProject: in another project's or domain's part of a templated prefix.
	ReasonOtherProject = "other_project"
	// ReasonSymlink: a symbolic link leads out of a file:// prefix.
	ReasonSymlink = "symlink"
	// ReasonReserved: a path through a directory the executor keeps for itself.
	ReasonReserved = "reserved"
	// ReasonFileNotConfigured: an action's own file:// location, with no allowed
	// prefixes configured; file:// is used only under a prefix that names it.
	ReasonFileNotConfigured = "file_not_configured"
)

// NotAllowedError says why a URI was refused.
type NotAllowedError struct {
	URI    string
	Reason string
	Why    string
}

// The URI is quoted: it may come from anyone who can write a cache entry.
func (e *NotAllowedError) Error() string { return fmt.Sprintf("datastore: %q: %s", e.URI, e.Why) }

// Is makes errors.Is(err, ErrNotAllowed) hold.
func (e *NotAllowedError) Is(target error) bool { return target == ErrNotAllowed }

// IsNotAllowed reports whether err, or an error it wraps, is a store's refusal of a URI
// the caller may not use. No retry changes that: the store's configuration decides it.
func IsNotAllowed(err error) bool { return errors.Is(err, ErrNotAllowed) }

// Checker is a store that tells whether it would refuse a URI, without reading or
// writing: a plugin checks where it will look before it starts anything.
type Checker interface {
	// Check returns the *NotAllowedError Read (write: Write) would return, or nil.
	Check(uri string, write bool) error
}

// Check returns the refusal store would give uri (for writing when write), or nil when it
// would not refuse it or cannot tell without trying (it is no Checker).
func Check(store DataStore, uri string, write bool) error {
	if c, ok := store.(Checker); ok {
		return c.Check(uri, write)
	}
	return nil
}
