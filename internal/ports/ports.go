// Package ports finds free TCP ports on 127.0.0.1 for programs that tests start and that
// must be told their port in advance.
//
// A port found by listening on :0 comes from the kernel's ephemeral range, which every
// outgoing connection and every other :0 listener on the machine draws from too: in the
// seconds before the program binds it, something else often has. These ports come from
// below that range instead, where only an explicit bind can take them.
package ports

import (
	"fmt"
	"math/rand/v2"
	"net"
)

// Below the usual ephemeral range (32768–60999 on Linux) and above the common services.
const lowest, highest = 20000, 32767

// Free returns n distinct ports that are free now.
func Free(n int) ([]int, error) {
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
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		held = append(held, l) // held until all are found, so none is handed out twice
		out = append(out, port)
	}
	return out, nil
}
