package flytek8s

import (
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSignalNamesAreLinux: the written-out signal names are Linux's.
func TestSignalNamesAreLinux(t *testing.T) {
	for n := int32(1); n <= maxSignal; n++ {
		if got, want := signalNames[n], unix.SignalName(syscall.Signal(n)); got != want {
			t.Errorf("signal %d is %q here; Linux calls it %q", n, got, want)
		}
	}
}
