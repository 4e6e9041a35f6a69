package v1

// PhaseHistory is an action's phase history (TaskActionStatus.PhaseHistory), oldest
// entry first. Its methods are the history's rules that more than the reconciler needs:
// which entry is the last, how entries are ordered, how the next one is numbered.
type PhaseHistory []PhaseTransition

// Last is the newest entry; ok is false for an empty history.
func (h PhaseHistory) Last() (last PhaseTransition, ok bool) {
	if len(h) == 0 {
		return PhaseTransition{}, false
	}
	return h[len(h)-1], true
}

// NextVersion is the version of an entry of attempt appended to h: one more than the
// last entry's if that is of the same attempt, else 0. Entries go only to the end and
// the last is never dropped, so an attempt's versions only grow, whatever older entries
// the history has dropped or folded.
func (h PhaseHistory) NextVersion(attempt int32) int32 {
	if last, ok := h.Last(); ok && last.Attempt == attempt {
		return last.Version + 1
	}
	return 0
}

// HistoryMark identifies an entry of an action's history, and so the event it is to the
// events service: its attempt, and its version within the attempt. Marks order the
// entries (Before); a mark is all a reader that only counts progress (what was
// delivered, what the informer shows) needs to keep of an entry. It is no part of the
// resource, and needs no deepcopy.
//
// +kubebuilder:object:generate=false
type HistoryMark struct {
	Attempt int32
	Version int32
}

// Mark is t's place in its history.
func (t *PhaseTransition) Mark() HistoryMark {
	return HistoryMark{Attempt: t.Attempt, Version: t.Version}
}

// Before reports whether the entry m marks comes before o's: an earlier attempt, or the
// same attempt and a lower version.
func (m HistoryMark) Before(o HistoryMark) bool {
	return m.Attempt < o.Attempt || m.Attempt == o.Attempt && m.Version < o.Version
}
