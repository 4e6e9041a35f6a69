package app

import (
	"flag"
	"io"
	"testing"
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
