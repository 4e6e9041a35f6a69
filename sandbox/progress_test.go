package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// said collects what a step says, from its heartbeat's goroutine and the caller's.
type said struct {
	mu    sync.Mutex
	lines []string
}

func (s *said) say(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, fmt.Sprintf(format, args...))
}

func (s *said) text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

// TestLongStepSaysWhatItDoesAndHowLong: a step says what it builds and how long that
// takes the first time; a long one says it is still at work while it runs and how long
// it took; a quick one says nothing more; a failed one returns its error.
func TestLongStepSaysWhatItDoesAndHowLong(t *testing.T) {
	failed := errors.New("compile error")
	for _, tc := range []struct {
		name     string
		slow     bool
		err      error
		want     []string
		wantNone []string
	}{
		{name: "quick", want: []string{"building x (about 3 min the first time)"}, wantNone: []string{"still", "done in"}},
		{name: "slow", slow: true, want: []string{"building x (about 3 min the first time)", "  still building x: ", "  building x: done in "}},
		{name: "failed", err: failed, want: []string{"building x (about 3 min"}, wantNone: []string{"done in"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s said
			period := time.Hour
			if tc.slow {
				period = time.Millisecond
			}
			err := longStep(s.say, "building x", "about 3 min", period, func() error {
				// A slow step runs until its heartbeat has been heard.
				for tc.slow && !strings.Contains(s.text(), "still") {
					time.Sleep(time.Millisecond)
				}
				return tc.err
			})
			if !errors.Is(err, tc.err) {
				t.Fatalf("longStep returned %v, want %v", err, tc.err)
			}
			got := s.text()
			checkSaid(t, got, tc.want, tc.wantNone)
			// Nothing after the step returned.
			if after := s.text(); after != got {
				t.Errorf("the step went on talking after it returned: %q", strings.TrimPrefix(after, got))
			}
		})
	}
}

// checkSaid holds what a step said to holding each of want and none of none.
func checkSaid(t *testing.T, said string, want, none []string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(said, w) {
			t.Errorf("said:\n%s\nlacking %q", said, w)
		}
	}
	for _, w := range none {
		if strings.Contains(said, w) {
			t.Errorf("said:\n%s\nwhich should not have %q", said, w)
		}
	}
}
