package store

import (
	"strings"
	"testing"
)

// TestTextTheDatabaseCannotHoldIsRefused: whatever gets past the contract, the store
// names the field instead of sending Postgres what it refuses with an SQLSTATE.
func TestTextTheDatabaseCannotHoldIsRefused(t *testing.T) {
	good := Key{"demo", "development", "demo.train", "1", "sig", "inputs"}
	tests := []struct {
		name      string
		check     func() error
		wantField string
	}{
		{"a good key", good.check, ""},
		{"NUL in a key", func() error { k := good; k.TaskName = "a\x00b"; return k.check() }, "key.task_name"},
		{"invalid UTF-8 in a key", func() error { k := good; k.Project = "\xff"; return k.check() }, "key.project"},
		{"an overlong key part", func() error { k := good; k.InputsHash = strings.Repeat("a", 129); return k.check() }, "key.inputs_hash"},
		{"NUL in an owner_id", Claimant{OwnerID: "a\x00", Identity: "executor"}.check, "owner_id"},
		{"an overlong identity", Claimant{OwnerID: "a", Identity: strings.Repeat("i", 1025)}.check, "caller identity"},
		{"an attempt past int32", PutRequest{Key: good, SourceAttempt: 1 << 31}.check, "source_attempt"},
		{"NUL in an output URI", PutRequest{Key: good, OutputURI: "s3://b/\x00", SourceAttempt: 1}.check, "output_uri"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.check()
			if tt.wantField == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if fe, ok := err.(*FieldError); !ok || fe.Field != tt.wantField {
				t.Fatalf("got %v; want a FieldError for %s", err, tt.wantField)
			}
		})
	}
}
