package sandbox_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/flytekube/backend/sandbox"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// TestSandboxRunsTheExamples is `make run` from start to end, as a newcomer gets it:
// every program as its own process, the examples applied, each ending as its file says
// (the sleep and the flaky one succeed, the second echo is a cache hit, the invalid one
// is refused), and everything stopped afterwards.
func TestSandboxRunsTheExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the whole system")
	}
	t.Setenv("KUBECONFIG", "") // the embedded control plane, whatever the caller's shell has
	var out bytes.Buffer
	o := sandbox.Options{
		Dir: t.TempDir(), UntilSettled: true, Timeout: 2 * time.Minute,
		EventsPort: freePort(t), CachePort: freePort(t), ExecutorHealthPort: freePort(t), ExecutorMetricsPort: freePort(t),
		JaegerQueryPort: freePort(t), JaegerOTLPPort: freePort(t),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	err := sandbox.Run(ctx, o, &out)
	t.Log(out.String())
	if err != nil {
		for _, name := range []string{"executor", "events", "cacheservice"} {
			if raw, rerr := os.ReadFile(o.Dir + "/logs/" + name + ".log"); rerr == nil {
				t.Logf("%s.log:\n%s", name, tail(string(raw), 30))
			}
		}
		t.Fatal(err)
	}
	for _, want := range []string{"echo-again: Succeeded", "Hit", "invalid: Rejected", "every example ended as expected", "bufcurl"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %q", want)
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
