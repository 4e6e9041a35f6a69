package main

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	var out, errOut strings.Builder
	if code := run([]string{"--dir", dir, "--host", "events", "--host=cacheservice"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "wrote ") || !strings.Contains(out.String(), "viewer.token") {
		t.Errorf("first run said %q", out.String())
	}
	out.Reset()
	if code := run([]string{"--dir", dir, "--host", "events", "--host=cacheservice"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "kept") {
		t.Errorf("second run said %q, want the credentials kept", out.String())
	}
	for _, args := range [][]string{nil, {"--dir", dir, "extra"}, {"--nope"}, {"--dir", dir, "--host="}} {
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("run(%q) = %d, want 2", args, code)
		}
	}
}
