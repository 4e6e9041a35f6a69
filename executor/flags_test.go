package executor_test

import (
	"flag"
	"io"
	"slices"
	"testing"

	"github.com/flytekube/backend/executor"
)

// TestFlagsConfigRepeats: --config may be given more than once, the files kept in the
// order given, for config.LoadFiles to layer; an empty value names no file, as it always has.
func TestFlagsConfigRepeats(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{args: nil, want: nil},
		{args: []string{"--config", "base.yaml"}, want: []string{"base.yaml"}},
		{args: []string{"--config", "base.yaml", "--config=site.yaml", "-config", "x,y.yaml"}, want: []string{"base.yaml", "site.yaml", "x,y.yaml"}},
		{args: []string{"--config="}, want: []string{""}},
	}
	for _, tt := range tests {
		fs := flag.NewFlagSet("executor", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		files, _ := executor.Flags(fs)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatalf("Parse(%q) = %v", tt.args, err)
		}
		if !slices.Equal([]string(*files), tt.want) {
			t.Errorf("Parse(%q): --config = %q, want %q", tt.args, *files, tt.want)
		}
		if def := fs.Lookup("config").DefValue; def != "" {
			t.Errorf("--config's default = %q, want empty", def)
		}
	}
}
