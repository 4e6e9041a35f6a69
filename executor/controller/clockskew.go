package controller

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
)

// boundWrittenTimes reads the times another executor wrote in the status (an attempt's
// start, the next attempt's time) as this executor's clock allows. They were written on
// the clock of whichever executor led then, which may have been off (set wrong, or
// stepped since), and each one read as written would carry its error into every later
// pass: a start an hour ahead delays the timeout by that hour, a next attempt an hour
// ahead holds a retry back that long, a start an hour behind times the attempt out at
// once. So a start is kept within [the action's creation, now], the creation being the
// API server's clock (the earlier of the two, should this executor's be behind), and a
// next attempt no further ahead than the longest backoff. A step can then cost at most
// what it touches once: never more than the time it was due to take.
func (s *scope) boundWrittenTimes(context.Context) (ctrl.Result, error) {
	st := &s.ta.Status
	now := s.now.Time
	earliest := s.ta.CreationTimestamp.Time
	if earliest.After(now) {
		earliest = now
	}
	for _, t := range []**metav1.Time{&st.AttemptStartedAt, &st.StartedAt} {
		if *t != nil {
			**t = metav1.NewTime(within((*t).Time, earliest, now))
		}
	}
	if next := st.NextAttemptAt; next != nil {
		*next = metav1.NewTime(within(next.Time, next.Time, now.Add(s.r.Options.Backoff.Cap)))
	}
	return ctrl.Result{}, nil
}

// within is t held to [earliest, latest].
func within(t, earliest, latest time.Time) time.Time {
	switch {
	case t.Before(earliest):
		return earliest
	case t.After(latest):
		return latest
	}
	return t
}
