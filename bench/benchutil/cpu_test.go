package benchutil

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// A meter sees the CPU a process spends, through getrusage for itself and through /proc
// for a group that chooses it, and both agree.
func TestCPUMeterSeesWork(t *testing.T) {
	m := CPUMeter{Groups: map[string]func(Proc) bool{
		"self by /proc": func(p Proc) bool { return p.PID == os.Getpid() },
		"nobody":        func(Proc) bool { return false },
	}}
	// 300 ms of this process's CPU, however long a loaded machine takes to give it.
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	x := 0
	use, err := m.Measure(func() error {
		for start := cpu(); cpu()-start < 300*time.Millisecond; {
			for range 100_000 {
				x++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{SelfGroup, "self by /proc"} {
		if use[g] < 250*time.Millisecond {
			t.Errorf("%s grew by %v over 300 ms of CPU (%d loops)", g, use[g], x)
		}
	}
	if diff := (use[SelfGroup] - use["self by /proc"]).Abs(); diff > 50*time.Millisecond {
		t.Errorf("getrusage saw %v and /proc %v of the same work", use[SelfGroup], use["self by /proc"])
	}
	if use["nobody"] != 0 {
		t.Errorf("a group of no process used %v", use["nobody"])
	}
	if per := use.Per(2); per[SelfGroup] != use[SelfGroup]/2 || use.Total() < use[SelfGroup]+use["self by /proc"] {
		t.Errorf("Per(2) = %v, Total = %v of %v", per, use.Total(), use)
	}
}

// The time of a child that has exited counts to the parent's group, as the time of
// Postgres's ended backends counts to the postmaster's.
func TestCPUMeterCountsExitedChildren(t *testing.T) {
	self := os.Getpid()
	m := CPUMeter{Groups: map[string]func(Proc) bool{
		"self": func(p Proc) bool { return p.PID == self && p.Comm != "" },
	}}
	use, err := m.Measure(func() error {
		return exec.Command("sh", "-c", `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done`).Run()
	})
	if err != nil {
		t.Fatal(err)
	}
	if children := use["self"] - use[SelfGroup]; children < 50*time.Millisecond {
		t.Errorf("the group grew by %v and this process by %v: the exited child's time is missing", use["self"], use[SelfGroup])
	}
}
