package nodetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStopOrphans: a node whose owner died is stopped (and its files kept); a node whose
// owner lives is left alone, and starting another fails naming it.
func TestStopOrphans(t *testing.T) {
	done := exec.Command("true")
	if err := done.Run(); err != nil {
		t.Fatal(err)
	}
	dead := done.Process.Pid
	tests := []struct {
		name        string
		owner       string // "" writes no owner file
		stopped     bool   // already marked stopped
		wantErr     bool
		wantStopped bool
	}{
		{name: "owner died", owner: strconv.Itoa(dead), wantStopped: true},
		{name: "owner alive", owner: strconv.Itoa(os.Getpid()), wantErr: true},
		{name: "owner alive but stopped", owner: strconv.Itoa(os.Getpid()), stopped: true, wantStopped: true},
		{name: "no owner", wantStopped: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmp := t.TempDir()
			dir := filepath.Join(tmp, "flyte-node-x")
			if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
				t.Fatal(err)
			}
			if tt.owner != "" {
				if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(tt.owner), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tt.stopped {
				if err := os.WriteFile(filepath.Join(dir, stoppedFile), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := stopOrphans(tmp)
			if tt.wantErr != (err != nil) || err != nil && !strings.Contains(err.Error(), dir) {
				t.Fatalf("err %v; want an error naming %s: %v", err, dir, tt.wantErr)
			}
			_, statErr := os.Stat(filepath.Join(dir, stoppedFile))
			if stopped := statErr == nil; stopped != tt.wantStopped {
				t.Fatalf("marked stopped: %v; want %v", stopped, tt.wantStopped)
			}
			if _, err := os.Stat(filepath.Join(dir, "logs")); err != nil {
				t.Fatalf("the node's files went: %v", err)
			}
		})
	}
}

// TestLockMachineWaitsForTheHolder: a second Start waits until the node before it stops,
// instead of failing or starting a second node beside it.
func TestLockMachineWaitsForTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), lockFile)
	first, err := lockMachine(path)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		second, err := lockMachine(path)
		if err == nil {
			err = second.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("the second lock was taken while the first was held (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	n := &Node{lock: first}
	n.unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second lock was not taken after the first was released")
	}
}
