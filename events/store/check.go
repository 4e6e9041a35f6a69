package store

import (
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// What the store accepts. The contract (events.proto) says the same and the server
// validates it, but binary protobuf carries values the JSON mapping cannot (nanos out of
// range, invalid UTF-8 built by hand, fields of a newer schema), and Record may be called
// without the server, so the store checks again what would corrupt its rows or orders.
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

// checkEvent drops the fields of ev that the schema does not name (the store would keep
// any number of bytes no reader asked for) and refuses what the store cannot hold
// faithfully. i is the event's position in its batch.
func checkEvent(i int, ev *eventsv1.ActionEvent) error {
	path := fmt.Sprintf("events[%d]", i)
	if err := checkKey(path+".id", ev.GetId()); err != nil {
		return err
	}
	switch a := ev.GetAttempt(); {
	case a < 1 || a > MaxAttempt:
		return invalid(path+".attempt", "%d is not an attempt the executor makes (1 to %d)", a, MaxAttempt)
	case ev.GetVersion() > MaxVersion:
		return invalid(path+".version", "%d is more than %d", ev.GetVersion(), MaxVersion)
	case ev.GetOccurredAt() == nil:
		return invalid(path+".occurred_at", "required")
	}
	if _, ok := flytecorev1.ActionPhase_name[int32(ev.GetPhase())]; !ok || ev.GetPhase() == flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED {
		return invalid(path+".phase", "%d is not a phase", ev.GetPhase())
	}
	return sanitize(ev.ProtoReflect(), path)
}

// checkKey refuses names that are not DNS labels: the key's parts are joined with '/' in
// notifications, and stored as text, which holds no NUL.
func checkKey(path string, id *flytecorev1.ActionIdentifier) error {
	if id == nil {
		return invalid(path, "required")
	}
	for _, part := range []struct{ field, name string }{
		{"project", id.GetProject()}, {"domain", id.GetDomain()}, {"run", id.GetRun()}, {"action", id.GetAction()},
	} {
		if !isLabel(part.name) {
			return invalid(path+"."+part.field, "must be a DNS label of at most 63 characters")
		}
	}
	return nil
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

// sanitize walks m and every message it holds: it drops unknown fields, and refuses text
// that is not UTF-8 or holds NUL and timestamps outside [MinTime, MaxTime) or with nanos
// outside [0, 1e9). path names m in errors.
func sanitize(m protoreflect.Message, path string) error {
	m.SetUnknown(nil)
	if ts, ok := m.Interface().(*timestamppb.Timestamp); ok {
		return checkTime(path, ts)
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		err = sanitizeField(fd, v, path+"."+string(fd.Name()))
		return err == nil
	})
	return err
}

func sanitizeField(fd protoreflect.FieldDescriptor, v protoreflect.Value, path string) error {
	switch {
	case fd.IsMap():
		return nil // events hold no maps
	case fd.IsList():
		list := v.List()
		for i := range list.Len() {
			if err := sanitizeValue(fd, list.Get(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	}
	return sanitizeValue(fd, v, path)
}

func sanitizeValue(fd protoreflect.FieldDescriptor, v protoreflect.Value, path string) error {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return sanitize(v.Message(), path)
	case protoreflect.StringKind:
		return checkText(path, v.String())
	}
	return nil
}

func checkText(path, s string) error {
	if !utf8.ValidString(s) {
		return invalid(path, "not valid UTF-8")
	}
	if strings.IndexByte(s, 0) >= 0 {
		return invalid(path, "contains a NUL byte")
	}
	return nil
}

func checkTime(path string, ts *timestamppb.Timestamp) error {
	if n := ts.GetNanos(); n < 0 || n >= 1e9 {
		return invalid(path, "nanos %d is outside [0, 1e9)", n)
	}
	if s := ts.GetSeconds(); s < MinTime.Unix() || s >= MaxTime.Unix() {
		return invalid(path, "must be in the years %d to %d", MinTime.Year(), MaxTime.Year()-1)
	}
	return nil
}
