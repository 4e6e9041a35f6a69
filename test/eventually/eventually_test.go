package eventually_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flytekube/backend/test/eventually"
)

func TestTrueReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	eventually.True(t, 10*time.Second, func() bool { return calls.Add(1) == 3 },
		func() string { return "never reached three calls" })
	if n := calls.Load(); n != 3 {
		t.Fatalf("cond called %d times; want 3: it holds at the third", n)
	}
}

func TestTrueFailsTheTestWithTheLastState(t *testing.T) {
	rec := &recorder{TB: t}
	var last int
	done := make(chan struct{})
	go func() { // Fatalf ends the goroutine it runs on
		defer close(done)
		eventually.True(rec, 100*time.Millisecond, func() bool { last++; return false },
			func() string { rec.seen = last; return "never" })
	}()
	<-done
	if !rec.failed || rec.msg != "never (waited 100ms)" {
		t.Fatalf("failed %v with %q; want the message and the timeout", rec.failed, rec.msg)
	}
	if rec.seen != last || last < 2 {
		t.Fatalf("the message saw %d calls of %d; want the last, after several", rec.seen, last)
	}
}

// recorder takes a test's failure instead of failing it.
type recorder struct {
	testing.TB
	failed bool
	msg    string
	seen   int
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = true
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
