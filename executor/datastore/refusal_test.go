package datastore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/storage"
)

// TestRefusalsNameTheirCause: with storage.allowedPrefixes empty, an action's own
// file:// locations are refused for that reason, named, not as if they lay outside the
// action; Check answers as Read and Write do, without touching anything.
func TestRefusalsNameTheirCause(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	none, err := datastore.Confine(datastore.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	some, err := datastore.Confine(datastore.New(), []string{"mem://data/"})
	if err != nil {
		t.Fatal(err)
	}
	ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{Project: "p", Domain: "d", ActionName: "a0",
		InputURI: "file://" + dir + "/in/inputs.json", RunOutputBase: "file://" + dir + "/r1"}}
	tests := []struct {
		name       string
		store      storage.Checker
		uri        string
		write      bool
		wantReason string
		wantWhy    string // in the message
	}{
		{"own output base, write", none.ForAction(ta).(storage.Checker), "file://" + dir + "/r1/a0/1/outputs.json", true, storage.ReasonFileNotConfigured, "storage.allowedPrefixes lists a prefix holding it, and it lists none"},
		{"own output base, read", none.ForAction(ta).(storage.Checker), "file://" + dir + "/r1/a0/1/error.json", false, storage.ReasonFileNotConfigured, "storage.allowedPrefixes"},
		{"own input, read", none.ForAction(ta).(storage.Checker), "file://" + dir + "/in/inputs.json", false, storage.ReasonFileNotConfigured, "storage.allowedPrefixes"},
		{"own input, write", none.ForAction(ta).(storage.Checker), "file://" + dir + "/in/inputs.json", true, storage.ReasonOutside, "outside the action's inputs and output base"},
		{"elsewhere on disk", none.ForAction(ta).(storage.Checker), "file:///etc/passwd", false, storage.ReasonOutside, "outside the action's inputs and output base"},
		{"no prefixes, outside a view", none, "mem://data/x", false, storage.ReasonOutside, "storage.allowedPrefixes is empty"},
		{"under no prefix", some, "file://" + dir + "/r1/a0/1/outputs.json", false, storage.ReasonOutside, "under none of the allowed prefixes (storage.allowedPrefixes)"},
		{"under no prefix, in a view", some.ForAction(ta).(storage.Checker), "file://" + dir + "/r1/a0/1/outputs.json", false, storage.ReasonOutside, "storage.allowedPrefixes"},
		{"allowed", some, "mem://data/x", false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checked := tt.store.Check(tt.uri, tt.write)
			var err error
			if tt.write {
				err = tt.store.(interface {
					Write(context.Context, string, []byte) error
				}).Write(ctx, tt.uri, []byte("x"))
			} else {
				_, err = tt.store.(interface {
					Read(context.Context, string) ([]byte, error)
				}).Read(ctx, tt.uri)
			}
			if tt.wantReason == "" {
				if checked != nil {
					t.Fatalf("Check: %v; want nil", checked)
				}
				return
			}
			for what, err := range map[string]error{"Check": checked, "the call": err} {
				var refused *storage.NotAllowedError
				if !errors.As(err, &refused) || refused.Reason != tt.wantReason || !strings.Contains(err.Error(), tt.wantWhy) {
					t.Errorf("%s: %v; want a refusal (%s) saying %q", what, err, tt.wantReason, tt.wantWhy)
				}
			}
		})
	}
}
