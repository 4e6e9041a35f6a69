package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// TestCommandLine: "NAME migrate [flags]" is --migrate=apply-and-exit; a serving
// command line keeps its --migrate; the two together are refused.
func TestCommandLine(t *testing.T) {
	tests := []struct {
		args    []string
		want    MigrateMode
		wantErr bool
	}{
		{args: nil, want: MigrateApply},
		{args: []string{"--migrate=wait"}, want: MigrateWait},
		{args: []string{"migrate"}, want: MigrateAndExit},
		{args: []string{"migrate", "--migration-lock-timeout=5s"}, want: MigrateAndExit},
		{args: []string{"migrate", "--migrate=wait"}, wantErr: true},
		{args: []string{"--migrate=later"}, wantErr: true},
		{args: []string{"serve"}, wantErr: true},
	}
	for _, tt := range tests {
		fs := flag.NewFlagSet("svc", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var mc MigrateConfig
		MigrateFlags(fs, &mc)
		err := parseCommandLine(fs, tt.args)
		switch {
		case tt.wantErr && err == nil:
			t.Errorf("%q: parsed as %q; want an error", tt.args, mc.Mode)
		case !tt.wantErr && (err != nil || mc.Mode != tt.want):
			t.Errorf("%q: %q, %v; want %q", tt.args, mc.Mode, err, tt.want)
		}
	}
}

// TestTheLibrariesLogJSON: what the Kubernetes libraries log (a TokenReview that could not
// be sent, through klog; the certificate watcher, through controller-runtime) comes out
// as the service's own JSON lines, not as klog's plain text.
func TestTheLibrariesLogJSON(t *testing.T) {
	var out bytes.Buffer
	newLogger(&out)
	klog.ErrorS(errors.New("connection refused"), "Failed to make webhook authenticator request")
	klog.Flush()
	ctrllog.Log.WithName("certwatcher").Info("Updated current TLS certificate")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("logged %d lines, want 2:\n%s", len(lines), out.String())
	}
	for _, line := range lines {
		if !json.Valid([]byte(line)) {
			t.Errorf("not a JSON line: %s", line)
		}
	}
}
