package store

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/services/postgres"
)

// What the store accepts. The contract (events.proto) says the same and the server
// validates it, but binary protobuf carries values the JSON mapping cannot (nanos out of
// range, invalid UTF-8 built by hand), and Record may be called without the server, so
// the store checks again what would corrupt its rows or orders. What a newer schema adds
// (fields, enum values) is kept: it is bounded by MaxEventBytes like the rest.
var (
	// MinTime and MaxTime (exclusive) bound every timestamp of an event: the years 2000
	// to 2200. Outside them, nanoseconds since the epoch overflow (before 1678, after
	// 2262) or a forged date would decide the fold and retention.
	MinTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	MaxTime = time.Date(2201, 1, 1, 0, 0, 0, 0, time.UTC)
)

const (
	// MaxAttempt is the most attempts the executor makes: the first, 10 user retries (a
	// TaskAction's maximum) and 100 system failures (its configuration's maximum). A
	// greater attempt would outrank every real event of its action.
	MaxAttempt = 1 + 10 + 100
	// MaxVersion is the largest version the integer column holds; a greater one would be
	// stored negative and lose the fold to older versions.
	MaxVersion = math.MaxInt32
	// MaxEventBytes bounds one encoded event. The contract's bounds allow about 2.5 MiB
	// (every string at its longest, in 4-byte characters); this backstop keeps a page of
	// one event under a response cap of 4 MiB.
	MaxEventBytes = 3 << 20
	// MaxPhase is the largest phase the smallint columns hold; phases past the ones this
	// release names are a newer release's, and kept.
	MaxPhase = math.MaxInt16
)

// InvalidEventError names the field of a batch that the store refuses.
type InvalidEventError struct {
	// Field is the field's path in the request, such as "events[3].occurred_at".
	Field string
	// Reason says what is wrong with it.
	Reason string
}

func (e *InvalidEventError) Error() string { return e.Field + ": " + e.Reason }

func invalid(field, format string, args ...any) *InvalidEventError {
	return &InvalidEventError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// checkEvent refuses what the store cannot hold faithfully: text that is not UTF-8 or
// holds NUL, timestamps outside [MinTime, MaxTime) or with nanos outside [0, 1e9), a
// phase its column cannot hold. Fields the schema does not name are left in ev, and
// stored with it. i is the event's position in its batch.
func checkEvent(i int, ev *eventsv1.ActionEvent) error {
	if err := checkFields(ev); err != nil {
		err.Field = "events[" + strconv.Itoa(i) + "]" + err.Field
		return err
	}
	return nil
}

// checkFields is checkEvent with errors naming fields relative to the event (".attempt").
// It reads the fields by name rather than walking the message by reflection, which cost
// ten times as much per event; TestStoreChecksEveryStringAndTimestamp walks the schema to
// make sure no field is missed.
func checkFields(ev *eventsv1.ActionEvent) *InvalidEventError {
	if err := checkKey(ev.GetId()); err != nil {
		return err
	}
	switch a := ev.GetAttempt(); {
	case a < 1 || a > MaxAttempt:
		return invalid(".attempt", "%d is not an attempt the executor makes (1 to %d)", a, MaxAttempt)
	case ev.GetVersion() > MaxVersion:
		return invalid(".version", "%d is more than %d", ev.GetVersion(), MaxVersion)
	case ev.GetOccurredAt() == nil:
		return invalid(".occurred_at", "required")
	}
	// A phase this release does not name is a newer executor's, stored and ranked below
	// the known ones (Rank); one the smallint column cannot hold would be stored as
	// another.
	if p := ev.GetPhase(); p < 1 || p > MaxPhase {
		return invalid(".phase", "%d is not a phase (1 to %d)", p, MaxPhase)
	}
	if err := checkTexts(
		namedText{".cluster", ev.GetCluster()}, namedText{".outputs_uri", ev.GetOutputsUri()},
		namedText{".reason", ev.GetReason()}, namedText{".message", ev.GetMessage()}, namedText{".task_type", ev.GetTaskType()},
	); err != nil {
		return err
	}
	if err := checkTime(".occurred_at", ev.GetOccurredAt()); err != nil {
		return err
	}
	if err := checkTime(".reported_at", ev.GetReportedAt()); err != nil {
		return err
	}
	if err := checkError(ev.GetError()); err != nil {
		return err
	}
	for i, ce := range ev.GetClusterEvents() {
		if err := checkClusterEvent(ce); err != nil {
			err.Field = ".cluster_events[" + strconv.Itoa(i) + "]" + err.Field
			return err
		}
	}
	for i, l := range ev.GetLogLinks() {
		if err := checkTexts(namedText{".name", l.GetName()}, namedText{".uri", l.GetUri()}); err != nil {
			err.Field = ".log_links[" + strconv.Itoa(i) + "]" + err.Field
			return err
		}
	}
	return nil
}

func checkError(e *flytecorev1.ExecutionError) *InvalidEventError {
	if err := checkTexts(namedText{".code", e.GetCode()}, namedText{".message", e.GetMessage()}); err != nil {
		err.Field = ".error" + err.Field
		return err
	}
	return nil
}

func checkClusterEvent(ce *eventsv1.ClusterEvent) *InvalidEventError {
	if err := checkTime(".occurred_at", ce.GetOccurredAt()); err != nil {
		return err
	}
	return checkTexts(
		namedText{".object", ce.GetObject()}, namedText{".type", ce.GetType()},
		namedText{".reason", ce.GetReason()}, namedText{".message", ce.GetMessage()},
		namedText{".source", ce.GetSource()},
	)
}

// namedText is a string field and its name.
type namedText struct{ field, value string }

func checkTexts(texts ...namedText) *InvalidEventError {
	for _, t := range texts {
		if err := checkText(t.value); err != nil {
			err.Field = t.field
			return err
		}
	}
	return nil
}

// checkKey refuses names that are not DNS labels: the key's parts are joined with '/' in
// notifications, and stored as text, which holds no NUL.
func checkKey(id *flytecorev1.ActionIdentifier) *InvalidEventError {
	switch {
	case id == nil:
		return invalid(".id", "required")
	case !isLabel(id.GetProject()):
		return notLabel(".id.project")
	case !isLabel(id.GetDomain()):
		return notLabel(".id.domain")
	case !isLabel(id.GetRun()):
		return notLabel(".id.run")
	case !isLabel(id.GetAction()):
		return notLabel(".id.action")
	}
	return nil
}

func notLabel(field string) *InvalidEventError {
	return invalid(field, "must be a DNS label of at most 63 characters")
}

func isLabel(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := range len(s) {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

func checkText(s string) *InvalidEventError {
	if problem := postgres.TextProblem(s); problem != "" {
		return invalid("", "%s", problem)
	}
	return nil
}

var minSeconds, maxSeconds = MinTime.Unix(), MaxTime.Unix()

// checkTime checks a timestamp field; an unset one is left to the caller.
func checkTime(field string, ts *timestamppb.Timestamp) *InvalidEventError {
	if ts == nil {
		return nil
	}
	if n := ts.GetNanos(); n < 0 || n >= 1e9 {
		return invalid(field, "nanos %d is outside [0, 1e9)", n)
	}
	if s := ts.GetSeconds(); s < minSeconds || s >= maxSeconds {
		return invalid(field, "must be in the years %d to %d", MinTime.Year(), MaxTime.Year()-1)
	}
	return nil
}
