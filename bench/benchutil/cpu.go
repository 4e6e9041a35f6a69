package benchutil

import (
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// clockTick is the unit of /proc's CPU times, USER_HZ, as the kernel gives it to every
// process in its auxiliary vector (AT_CLKTCK, which C's sysconf(_SC_CLK_TCK) reads).
var clockTick = sync.OnceValue(func() time.Duration {
	const atClkTck = 17 // from <elf.h>
	if auxv, err := unix.Auxv(); err == nil {
		for _, kv := range auxv {
			if kv[0] == atClkTck && kv[1] > 0 {
				return time.Second / time.Duration(kv[1])
			}
		}
	}
	return time.Second / 100 // Linux's USER_HZ on every architecture Go supports
})

// Proc names a process for a CPUMeter group's filter.
type Proc struct {
	PID, PPID int
	Comm      string
}

// SelfGroup names this process in a CPUUse.
const SelfGroup = "this process"

// CPUMeter reads the CPU time, user plus system, of this process and of groups of other
// processes chosen by their filters.
type CPUMeter struct {
	Groups map[string]func(Proc) bool
}

// CPUUse is CPU time by group, this process under SelfGroup.
type CPUUse map[string]time.Duration

// Read takes a reading: this process's time, and each group's from one pass over /proc,
// including the time of the group's children that have exited.
func (m CPUMeter) Read() (CPUUse, error) {
	use := CPUUse{SelfGroup: selfCPU()}
	if len(m.Groups) == 0 {
		return use, nil
	}
	for group := range m.Groups {
		use[group] = 0
	}
	procs, err := procfs.AllProcs()
	if err != nil {
		return nil, fmt.Errorf("benchutil: listing processes: %w", err)
	}
	for _, p := range procs {
		st, err := p.Stat()
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // the process ended meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("benchutil: process %d: %w", p.PID, err)
		}
		proc := Proc{PID: st.PID, PPID: st.PPID, Comm: st.Comm}
		ticks := time.Duration(st.UTime+st.STime) + time.Duration(st.CUTime+st.CSTime)
		for group, keep := range m.Groups {
			if keep(proc) {
				use[group] += ticks * clockTick()
			}
		}
	}
	return use, nil
}

// Measure runs f and returns the CPU time each group used meanwhile.
func (m CPUMeter) Measure(f func() error) (CPUUse, error) {
	before, err := m.Read()
	if err != nil {
		return nil, err
	}
	if err := f(); err != nil {
		return nil, err
	}
	after, err := m.Read()
	if err != nil {
		return nil, err
	}
	return after.Add(before, -1), nil
}

// Add returns u plus sign times v, group by group.
func (u CPUUse) Add(v CPUUse, sign int) CPUUse {
	out := CPUUse{}
	for g, d := range u {
		out[g] = d
	}
	for g, d := range v {
		out[g] += time.Duration(sign) * d
	}
	return out
}

// Per divides every group's time by n, to give it per operation.
func (u CPUUse) Per(n int) CPUUse {
	out := CPUUse{}
	for g, d := range u {
		out[g] = d / time.Duration(n)
	}
	return out
}

// Total is the time of all groups together.
func (u CPUUse) Total() (t time.Duration) {
	for _, d := range u {
		t += d
	}
	return t
}

func selfCPU() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
