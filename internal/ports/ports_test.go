package ports_test

import (
	"fmt"
	"net"
	"testing"

	"github.com/flytekube/backend/internal/ports"
)

func TestFreePortsAreDistinctBindableAndOutsideTheEphemeralRange(t *testing.T) {
	got, err := ports.Free(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range got {
		if seen[p] || p < 20000 || p >= 32768 {
			t.Fatalf("port %d: repeated or out of range in %v", p, got)
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		_ = l.Close()
	}
}
