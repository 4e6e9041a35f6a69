// Package eventsschema puts an events database in the schema the next release's contract
// migration will leave, so that tests hold this release's code to it: its code must work
// on that schema, since it runs beside the next release during that release's rollout.
package eventsschema

import (
	"context"
	"testing"
	"time"

	"github.com/flytekube/backend/events/store"
	"github.com/flytekube/backend/services/postgres"
)

// ToTheNextReleasesKeys completes the keys with the cluster (store.CompleteClusterKeys,
// which a running service's maintenance may be doing already: then it is waited for)
// and drops the keys of the name alone, as the next release's contract will: an action
// is then its name and its cluster. st is a store over dbURL's migrated database.
func ToTheNextReleasesKeys(t testing.TB, st *store.Store, dbURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		res, err := st.CompleteClusterKeys(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Skipped && res.Done {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the keys with the cluster were not completed within a minute")
		case <-time.After(10 * time.Millisecond):
		}
	}
	pool, err := postgres.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `ALTER TABLE actions DROP CONSTRAINT actions_pkey; ALTER TABLE action_events DROP CONSTRAINT action_events_pkey`); err != nil {
		t.Fatalf("dropping the keys of the name alone: %v", err)
	}
}
