package benchutil

import (
	"os"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		line  string
		proc  Proc
		ticks int64
	}{
		{"42 (postgres) S 7 42 42 0 -1 4194560 1 0 0 0 15 5 3 2 20 0 1 0 100 0 0",
			Proc{PID: 42, PPID: 7, Comm: "postgres"}, 25},
		{"9 (a (b) c) R 1 9 9 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 100 0 0",
			Proc{PID: 9, PPID: 1, Comm: "a (b) c"}, 3},
	}
	for _, tt := range tests {
		p, ticks, err := parseStat(tt.line)
		if err != nil || p != tt.proc || ticks != tt.ticks {
			t.Errorf("parseStat(%q) = %+v, %d, %v; want %+v, %d", tt.line, p, ticks, err, tt.proc, tt.ticks)
		}
	}
	if _, _, err := parseStat("garbage"); err == nil {
		t.Error("parseStat accepted a line without a command name")
	}
}

// The process's own CPU, as /proc reports it, grows while it computes.
func TestProcCPUSeesWork(t *testing.T) {
	self := func(p Proc) bool { return p.PID == os.Getpid() }
	before, err := ProcCPU(self)
	if err != nil {
		t.Fatal(err)
	}
	selfBefore := SelfCPU()
	x := 0
	for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
		x++
	}
	after, err := ProcCPU(self)
	if err != nil {
		t.Fatal(err)
	}
	if got := after - before; got < 100*time.Millisecond {
		t.Errorf("ProcCPU grew by %v over 300 ms of work (%d loops)", got, x)
	}
	if got := SelfCPU() - selfBefore; got < 100*time.Millisecond {
		t.Errorf("SelfCPU grew by %v over 300 ms of work", got)
	}
}
