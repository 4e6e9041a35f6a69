package benchutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// Proc names a process for ProcCPU's filter.
type Proc struct {
	PID, PPID int
	Comm      string
}

// ProcCPU returns the CPU time, user plus system, used so far by the processes keep
// chooses, including that of their children which have exited, read from /proc.
func ProcCPU(keep func(Proc) bool) (time.Duration, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, err
	}
	var ticks int64
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // the process ended meanwhile
		}
		p, times, err := parseStat(string(data))
		if err != nil {
			return 0, fmt.Errorf("benchutil: %s: %w", path, err)
		}
		if keep(p) {
			ticks += times
		}
	}
	return time.Duration(ticks) * clockTick, nil
}

// parseStat reads a /proc/PID/stat line: the process, and its utime, stime, cutime and
// cstime summed. The command name is in parentheses and may itself hold spaces or ')'.
func parseStat(line string) (Proc, int64, error) {
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return Proc{}, 0, fmt.Errorf("malformed stat line %q", line)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line[:open]))
	if err != nil {
		return Proc{}, 0, err
	}
	// After the name: state (field 3), ppid (4), ..., utime (14) to cstime (17).
	fields := strings.Fields(line[end+1:])
	if len(fields) < 15 {
		return Proc{}, 0, fmt.Errorf("short stat line %q", line)
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return Proc{}, 0, err
	}
	var ticks int64
	for _, f := range fields[11:15] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return Proc{}, 0, err
		}
		ticks += n
	}
	return Proc{PID: pid, PPID: ppid, Comm: line[open+1 : end]}, ticks, nil
}

// SelfCPU returns the CPU time, user plus system, this process has used so far.
func SelfCPU() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// CPUMeter reads the CPU time of this process and of other processes together.
type CPUMeter struct {
	// Others chooses the other processes; nil measures this process only.
	Others func(Proc) bool
}

// CPUSample is a reading of a CPUMeter.
type CPUSample struct {
	Self, Others time.Duration
}

// Read takes a sample.
func (m CPUMeter) Read() (CPUSample, error) {
	s := CPUSample{Self: SelfCPU()}
	if m.Others != nil {
		var err error
		if s.Others, err = ProcCPU(m.Others); err != nil {
			return CPUSample{}, err
		}
	}
	return s, nil
}

// Sub is the CPU time used between an earlier sample and s.
func (s CPUSample) Sub(earlier CPUSample) CPUSample {
	return CPUSample{Self: s.Self - earlier.Self, Others: s.Others - earlier.Others}
}
