// Package ports finds free TCP ports on 127.0.0.1 for programs that must be told their
// port in advance: child processes whose address other programs are configured with
// before they start (the sandbox's, compose's stand-ins), and controller-runtime's metrics
// server, which can be given an address but cannot tell which port it bound. A server
// that can report its address listens on 127.0.0.1:0 instead, and Jaeger and Postgres
// need no port chosen for them (test/jaegertest, hack/postgres.sh).
//
// A port found by listening on :0 comes from the kernel's ephemeral range, which every
// outgoing connection and every other :0 listener on the machine draws from too: in the
// seconds before the program binds it, something else often has (a sandbox run lost its
// metrics port that way). These ports come from outside that range instead, where only
// an explicit bind can take them.
package ports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
)

// Free returns n distinct ports that are free now.
func Free(n int) ([]int, error) {
	lowest, highest, err := outsideEphemeral()
	if err != nil {
		return nil, err
	}
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	out := make([]int, 0, n)
	for tries := 0; len(out) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("ports: no free port between %d and %d", lowest, highest)
		}
		port := lowest + rand.IntN(highest-lowest+1)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		held = append(held, l) // held until all are found, so none is handed out twice
		out = append(out, port)
	}
	return out, nil
}

// rangeFile holds the kernel's ephemeral range, "32768	60999" by default.
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// ephemeralRange reads the kernel's ephemeral range.
func ephemeralRange() (first, last int, err error) {
	data, err := os.ReadFile(rangeFile)
	if err != nil {
		return 0, 0, fmt.Errorf("ports: reading the ephemeral range: %w", err)
	}
	if _, err := fmt.Sscan(string(data), &first, &last); err != nil {
		return 0, 0, fmt.Errorf("ports: %s holds %q: %w", rangeFile, data, err)
	}
	return first, last, nil
}

// outsideEphemeral returns the ports from 20000 (above the common services) to just
// below the ephemeral range, or, when that range starts too low, those above it.
func outsideEphemeral() (lowest, highest int, err error) {
	first, last, err := ephemeralRange()
	if err != nil {
		return 0, 0, err
	}
	return outside(first, last)
}

func outside(first, last int) (lowest, highest int, err error) {
	const enough = 1000
	switch {
	case first-20000 >= enough:
		return 20000, first - 1, nil
	case 65535-last >= enough:
		return last + 1, 65535, nil
	default:
		return 0, 0, fmt.Errorf("ports: the ephemeral range %d-%d leaves too few ports outside it", first, last)
	}
}
