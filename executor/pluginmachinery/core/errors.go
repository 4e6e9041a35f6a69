package core

import "errors"

// transientError marks an error that says nothing about the action itself: the API
// server or a service had a bad moment (throttling, a 5xx, a lost reply).
type transientError struct{ err error }

func (e transientError) Error() string { return e.err.Error() }
func (e transientError) Unwrap() error { return e.err }

// Transient marks err as transient. A plugin whose Handle, Abort or Finalize returns a
// transient error gets the same call again after a backoff; the attempt spends neither
// its user retries nor the system budget, since repeating the step is always safe.
func Transient(err error) error {
	if err == nil || IsTransient(err) {
		return err
	}
	return transientError{err}
}

// IsTransient reports whether err, or an error it wraps, was marked Transient.
func IsTransient(err error) bool {
	var t transientError
	return errors.As(err, &t)
}
