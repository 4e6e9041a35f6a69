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
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return nil, err
	}
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // the process ended meanwhile
		}
		p, ticks, err := parseStat(string(data))
		if err != nil {
			return nil, fmt.Errorf("benchutil: %s: %w", path, err)
		}
		for group, keep := range m.Groups {
			if keep(p) {
				use[group] += time.Duration(ticks) * clockTick
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

func selfCPU() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
