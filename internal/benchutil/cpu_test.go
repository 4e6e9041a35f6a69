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

// A meter sees the CPU a process spends, through getrusage for itself and through /proc
// for a group that chooses it.
func TestCPUMeterSeesWork(t *testing.T) {
	m := CPUMeter{Groups: map[string]func(Proc) bool{
		"self by /proc": func(p Proc) bool { return p.PID == os.Getpid() },
		"nobody":        func(Proc) bool { return false },
	}}
	x := 0
	use, err := m.Measure(func() error {
		for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
			x++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{SelfGroup, "self by /proc"} {
		if use[g] < 100*time.Millisecond {
			t.Errorf("%s grew by %v over 300 ms of work (%d loops)", g, use[g], x)
		}
	}
	if use["nobody"] != 0 {
		t.Errorf("a group of no process used %v", use["nobody"])
	}
	if per := use.Per(2); per[SelfGroup] != use[SelfGroup]/2 || use.Total() < use[SelfGroup]+use["self by /proc"] {
		t.Errorf("Per(2) = %v, Total = %v of %v", per, use.Total(), use)
	}
}
