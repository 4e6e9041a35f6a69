package storage_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/storage"
)

// TestNotAllowedIsRecognisedThroughTheContract: a confined store's refusal, wrapped as
// callers wrap it, is recognised by the contract alone, with its reason; Check answers
// as the store would, and nil for a store that does not confine.
func TestNotAllowedIsRecognisedThroughTheContract(t *testing.T) {
	ctx := context.Background()
	confined, err := datastore.Confine(datastore.New(), []string{"mem://allowed/"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = confined.Read(ctx, "mem://elsewhere/x")
	wrapped := fmt.Errorf("plugin: reading the inputs: %w", err)
	if !storage.IsNotAllowed(wrapped) || !errors.Is(wrapped, storage.ErrNotAllowed) {
		t.Fatalf("IsNotAllowed(%v) = false; want true", wrapped)
	}
	var refused *storage.NotAllowedError
	if !errors.As(wrapped, &refused) || refused.Reason != storage.ReasonOutside || refused.URI != "mem://elsewhere/x" {
		t.Fatalf("errors.As(%v) = %+v; want a refusal of mem://elsewhere/x, reason %s", wrapped, refused, storage.ReasonOutside)
	}
	if err := storage.Check(confined, "mem://elsewhere/x", true); !storage.IsNotAllowed(err) {
		t.Errorf("Check(confined, elsewhere) = %v; want a refusal", err)
	}
	if err := storage.Check(confined, "mem://allowed/x", true); err != nil {
		t.Errorf("Check(confined, allowed) = %v; want nil", err)
	}
	// A store that confines nothing cannot tell; the call itself answers.
	if err := storage.Check(datastore.New(), "mem://elsewhere/x", true); err != nil {
		t.Errorf("Check(unconfined) = %v; want nil", err)
	}
	if err := storage.Check(nil, "mem://elsewhere/x", false); err != nil {
		t.Errorf("Check(nil) = %v; want nil", err)
	}
	for _, err := range []error{nil, storage.ErrNotFound, storage.ErrTooLarge, errors.New("datastore: outside")} {
		if storage.IsNotAllowed(err) {
			t.Errorf("IsNotAllowed(%v) = true; want false", err)
		}
	}
}
