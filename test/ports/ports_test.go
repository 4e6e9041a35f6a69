package ports

import (
	"fmt"
	"net"
	"testing"
)

func TestFreePortsAreDistinctBindableAndOutsideTheEphemeralRange(t *testing.T) {
	got, err := Free(20)
	if err != nil {
		t.Fatal(err)
	}
	first, last, err := ephemeralRange()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range got {
		if seen[p] || (p >= first && p <= last) || p < 20000 {
			t.Fatalf("port %d: repeated, in the ephemeral range %d-%d or below 20000, in %v", p, first, last, got)
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		_ = l.Close()
	}
}

func TestOutside(t *testing.T) {
	for _, tt := range []struct {
		first, last     int
		lowest, highest int // 0, 0: an error
	}{
		{32768, 60999, 20000, 32767}, // Linux's default
		{49152, 65535, 20000, 49151}, // the IANA range
		{15000, 40000, 40001, 65535}, // too low to fit below: above it
		{1024, 65000, 0, 0},          // no room either side
	} {
		lowest, highest, err := outside(tt.first, tt.last)
		if lowest != tt.lowest || highest != tt.highest || (err != nil) != (tt.lowest == 0) {
			t.Errorf("outside(%d, %d) = %d, %d, %v; want %d, %d", tt.first, tt.last, lowest, highest, err, tt.lowest, tt.highest)
		}
	}
}
