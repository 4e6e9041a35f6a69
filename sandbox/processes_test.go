package sandbox

import (
	"strings"
	"testing"
	"time"
)

// TestStopAsksThenKills: stop sends SIGTERM and waits for the program; one that ignores
// it is killed once stopGrace is over.
func TestStopAsksThenKills(t *testing.T) {
	defer func(g time.Duration) { stopGrace = g }(stopGrace)
	stopGrace = 500 * time.Millisecond
	tests := []struct {
		name, script, wantExit string
		atLeast                time.Duration
	}{
		{"shuts down when asked", "exec sleep 60", "signal: terminated", 0},
		{"ignores SIGTERM", "trap '' TERM; while :; do sleep 0.1; done", "signal: killed", stopGrace},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := startProcess("sh", "/bin/sh", t.TempDir(), nil, "-c", tt.script)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // the shell has set its trap
			start := time.Now()
			p.stop()
			took := time.Since(start)
			if err := <-p.done; err == nil || !strings.Contains(err.Error(), tt.wantExit) {
				t.Fatalf("the program ended with %v; want %q", err, tt.wantExit)
			}
			if took < tt.atLeast || took > stopGrace+5*time.Second {
				t.Fatalf("stop took %s; want at least %s and not much past the grace", took, tt.atLeast)
			}
		})
	}
}
