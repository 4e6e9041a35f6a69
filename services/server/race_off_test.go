//go:build !race

package server_test

// raceEnabled: this test binary runs with the race detector, which multiplies memory.
const raceEnabled = false
