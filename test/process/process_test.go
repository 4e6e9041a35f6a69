package process

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestStopAsksThenKills: Stop sends SIGTERM and waits for the program; one that ignores
// it is killed once the grace is over.
func TestStopAsksThenKills(t *testing.T) {
	const grace = 500 * time.Millisecond
	tests := []struct {
		name, script, wantExit string
		atLeast                time.Duration
	}{
		{"shuts down when asked", "exec sleep 60", "signal: terminated", 0},
		{"ignores SIGTERM", "trap '' TERM; echo trapped; while :; do sleep 0.1; done", "signal: killed", grace},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := New("sh", "/bin/sh", t.TempDir(), nil, "-c", tt.script)
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(tt.script, "trap") {
				// The shell has set its trap once it says so.
				if err := p.WaitFor(context.Background(), 10*time.Second, "set its trap", func(context.Context) bool {
					raw, _ := os.ReadFile(p.Log)
					return strings.Contains(string(raw), "trapped")
				}); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			p.Stop(grace)
			took := time.Since(start)
			exits := p.ExitLog()
			if len(exits) != 1 || !strings.Contains(exits[0].Err, tt.wantExit) || !exits[0].Expected {
				t.Fatalf("exits %+v; want one, expected, with %q", exits, tt.wantExit)
			}
			if took < tt.atLeast || took > grace+5*time.Second {
				t.Fatalf("Stop took %s; want at least %s and not much past the grace", took, tt.atLeast)
			}
			p.Stop(grace) // a second stop does nothing
		})
	}
}

// TestWaitFailsWhenTheProgramExits: a wait ends as soon as the program exits, with its
// exit in the error, and the exit is counted as one no one caused.
func TestWaitFailsWhenTheProgramExits(t *testing.T) {
	for _, tc := range []struct {
		name string
		// exitFirst waits for the exit before the wait starts: on a loaded machine
		// "exit 3" often ends before the caller gets to wait.
		exitFirst bool
	}{
		{name: "during the wait"},
		{name: "before the wait", exitFirst: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := New("sh", "/bin/sh", t.TempDir(), nil, "-c", "exit 3")
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			if exited := p.Exited(); tc.exitFirst && exited != nil {
				<-exited
			}
			err := p.WaitHTTP(context.Background(), http.DefaultClient, "http://127.0.0.1:1/", time.Minute)
			if err == nil || !strings.Contains(err.Error(), "exit status 3") {
				t.Fatalf("WaitHTTP: %v; want the exit", err)
			}
			if exits := p.ExitLog(); len(exits) != 1 || exits[0].Expected {
				t.Fatalf("exits %+v; want one not expected", exits)
			}
		})
	}
}

// TestLogAcrossStarts: a fresh log holds one run's output alone; a start again is
// appended and marked.
func TestLogAcrossStarts(t *testing.T) {
	dir := t.TempDir()
	p := New("echo", "/bin/sh", dir, nil, "-c", "echo ran")
	if err := os.WriteFile(p.Log, []byte("an earlier run\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.FreshLog = true
	for range 2 {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		if exited := p.Exited(); exited != nil { // nil: it has exited already
			<-exited
		}
	}
	raw, err := os.ReadFile(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	log := string(raw)
	if !strings.HasPrefix(log, "ran\n") || !strings.Contains(log, "=== start 2 of echo") || strings.Count(log, "ran\n") != 2 {
		t.Fatalf("the log:\n%s", log)
	}
}
