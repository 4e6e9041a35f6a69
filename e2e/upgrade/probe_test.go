package upgrade

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/flytekube/backend/test/repo"
)

// The probe's bound is on the longest run of consecutive failures of one RPC on one
// target, from its first failure to the next success (or the last failure's end).
func TestReportMeasuresTheLongestFailureRun(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	ok := func(at time.Duration) outcome { return outcome{at: t0.Add(at), took: 10 * time.Millisecond} }
	ko := func(at time.Duration, msg string) outcome {
		return outcome{at: t0.Add(at), took: 10 * time.Millisecond, err: errors.New(msg), step: "roll the services"}
	}
	tests := []struct {
		name     string
		outs     []outcome
		wantOver bool
		wantN    int
		wantSpan time.Duration
		wantErrs string
	}{
		{name: "none failed", outs: []outcome{ok(0), ok(time.Second)}},
		{name: "a short run", outs: []outcome{ok(0), ko(time.Second, "x"), ok(2 * time.Second)}, wantN: 1, wantSpan: time.Second},
		{name: "the longer of two runs, ended by a success", wantOver: true, wantN: 3, wantSpan: 3 * time.Second, wantErrs: "2x internal: boom under a ref; 1x aborted",
			outs: []outcome{ko(0, "x"), ok(time.Second), ko(2*time.Second, "aborted"), ko(3*time.Second, "internal: boom under ref 0123456789abcdef0123456789abcdef"),
				ko(4*time.Second, "internal: boom under ref fedcba9876543210fedcba9876543210"), ok(5 * time.Second)}},
		{name: "a run to the end", wantOver: true, wantN: 2, wantSpan: 3*time.Second + 10*time.Millisecond, wantErrs: "2x x",
			outs: []outcome{ok(0), ko(time.Second, "x"), ko(4*time.Second, "x")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &probe{log: func(string, ...any) {}, results: map[string][]outcome{"events Record": tt.outs}}
			lines, over := p.report()
			if len(lines) != 1 {
				t.Fatalf("report: %d lines, want 1: %v", len(lines), lines)
			}
			if got := len(over) > 0; got != tt.wantOver {
				t.Fatalf("over the bound: %v, want %v (%s)", got, tt.wantOver, lines[0])
			}
			if tt.wantN > 0 && !strings.Contains(lines[0], "longest failure run") {
				t.Fatalf("no failure run reported: %s", lines[0])
			}
			if !tt.wantOver {
				return
			}
			r := over[0]
			if r.n != tt.wantN || r.span != tt.wantSpan || r.step != "roll the services" {
				t.Errorf("run of %d over %s in %q, want %d over %s in roll the services", r.n, r.span, r.step, tt.wantN, tt.wantSpan)
			}
			if d := r.describe(t.TempDir()); !strings.Contains(d, tt.wantErrs) {
				t.Errorf("describe: %s\nwant it to hold %q", d, tt.wantErrs)
			}
		})
	}
}

func TestSlugIsAnIdentifierPart(t *testing.T) {
	for in, want := range map[string]string{"events-v0.1.0": "events-v0-1-0", "cacheservice-tree": "cacheservice-tree", "Events": "events"} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}

// The balancer spreads connections over the replicas in rotation, and a replica taken
// out of rotation gets no new one.
func TestBalancerSpreadsAndDrains(t *testing.T) {
	replica := func(name string) (string, func()) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = io.WriteString(c, name)
				_ = c.Close()
			}
		}()
		return ln.Addr().String(), func() { _ = ln.Close() }
	}
	a, closeA := replica("a")
	defer closeA()
	b, closeB := replica("b")
	defer closeB()
	lb, err := newBalancer()
	if err != nil {
		t.Fatal(err)
	}
	defer lb.close()
	read := func() string {
		c, err := net.Dial("tcp", lb.addr())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		got, _ := io.ReadAll(c)
		return string(got)
	}
	lb.set(a, b)
	seen := map[string]int{}
	for range 4 {
		seen[read()]++
	}
	if seen["a"] != 2 || seen["b"] != 2 {
		t.Fatalf("four connections over a and b went %v, want two each", seen)
	}
	lb.set(b)
	for range 3 {
		if got := read(); got != "b" {
			t.Fatalf("a connection after a left the rotation reached %q, want b", got)
		}
	}
}

// TestTheTreeUpgradesFromTheReleaseItsContractNames: the events store's migrations 00018 to
// 00020 drop the keys v0.2.0 writes through, and say v0.3.0's code works with the schema it
// leaves; the upgrade test's default therefore starts from v0.3.0, not v0.1.0.
func TestTheTreeUpgradesFromTheReleaseItsContractNames(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := oldestUpgradable(root)
	if err != nil || rel.Version != "v0.3.0" {
		t.Fatalf("oldestUpgradable = %s, %v; want v0.3.0", rel.Version, err)
	}
}
