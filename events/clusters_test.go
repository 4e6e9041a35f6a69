package events_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/flytekube/backend/events/store"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/eventsschema"
)

// inCluster is ev sent by the executor of cluster c.
func inCluster(c string, ev *eventsv1.ActionEvent) *eventsv1.ActionEvent {
	ev.Cluster = c
	return ev
}

// TestOneNameInTwoClusters: two clusters' executors record actions of one name. Neither
// overwrites the other's: on this release's schema, which keeps the previous release's
// key of the name alone, the second is refused (InvalidArgument, naming the holder,
// which the executors hold and offer again); on the next release's, both are kept, and
// reads tell them apart by cluster.
func TestOneNameInTwoClusters(t *testing.T) {
	for _, tc := range []struct {
		name string
		next bool // on the next release's schema
	}{
		{name: "this release's schema"},
		{name: "the next release's schema", next: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db := pg.NewDatabase(t)
			inst := startInstance(t, db)
			if tc.next {
				st, _ := openStore(t, db)
				eventsschema.ToTheNextReleasesKeys(t, st, db)
			}
			id := actionID("r1", "train")
			other := actionID("r1", "other")
			east := []*eventsv1.ActionEvent{inCluster("east", event(id, 1, queued, 0, 1)), inCluster("east", event(id, 1, running, 0, 2))}
			record(t, inst.client, east...)
			west := inCluster("west", event(id, 1, queued, 0, 3))

			_, err := inst.client.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{west, inCluster("west", event(other, 1, queued, 0, 3))}}))
			if !tc.next {
				if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), `cluster "east" has an action of that name`) {
					t.Fatalf("west's action of east's name: %v; want InvalidArgument naming east", err)
				}
				// The refused batch wrote nothing, and its other action goes alone.
				record(t, inst.client, inCluster("west", event(other, 1, queued, 0, 3)))
				if got := stateString(getActionIn(t, inst.client, id, nil)); !strings.HasPrefix(got, "attempt 1 ACTION_PHASE_RUNNING") {
					t.Fatalf("east's action after west's refusal: %s; want running", got)
				}
				if got := len(listEvents(t, inst.client, id, nil)); got != 2 {
					t.Fatalf("east's action has %d events; want its 2", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("west's action of east's name: %v", err)
			}
			// Both are kept, each with its own state and events.
			for _, want := range []struct {
				cluster        string
				state          string
				events, listed int
			}{{"east", "attempt 1 ACTION_PHASE_RUNNING", 2, 1}, {"west", "attempt 1 ACTION_PHASE_QUEUED", 1, 2}} {
				a := getActionIn(t, inst.client, id, proto.String(want.cluster))
				if !strings.HasPrefix(stateString(a), want.state) || a.GetCluster() != want.cluster {
					t.Errorf("%s's action: %s in %q; want %s", want.cluster, stateString(a), a.GetCluster(), want.state)
				}
				evs := listEvents(t, inst.client, id, proto.String(want.cluster))
				if len(evs) != want.events {
					t.Errorf("%s's action has %d events; want %d", want.cluster, len(evs), want.events)
				}
				for _, ev := range evs {
					if ev.GetCluster() != want.cluster {
						t.Errorf("%s's action lists an event of %q", want.cluster, ev.GetCluster())
					}
				}
				if n := len(listActions(t, inst.client, proto.String(want.cluster))); n != want.listed {
					t.Errorf("%s's actions listed: %d; want %d", want.cluster, n, want.listed)
				}
			}
			// Unnamed, the cluster is asked for.
			_, err = inst.client.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: id}))
			if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), `"east" and "west"`) {
				t.Fatalf("GetAction without a cluster: %v; want FailedPrecondition naming both", err)
			}
			_, err = inst.client.ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id}))
			if connect.CodeOf(err) != connect.CodeFailedPrecondition {
				t.Fatalf("ListActionEvents without a cluster: %v; want FailedPrecondition", err)
			}
			// Redelivered, each is absorbed as its own action's.
			if got := record(t, inst.client, append(east, west)...); got.GetDuplicates() != 3 {
				t.Fatalf("redelivery of both clusters' events: %v; want 3 duplicates", got)
			}
			if n := len(listActions(t, inst.client, nil)); n != 3 {
				t.Fatalf("%d actions listed; want 3 (train of east and west, other of west)", n)
			}
		})
	}
}

// TestThePreviousReleasesActionsAreAdopted: an action the previous release recorded
// names no cluster (the release does not know the column). It is found under any
// cluster, and the first event of a cluster makes it, and its events, that cluster's;
// another cluster's event of its name is then refused.
func TestThePreviousReleasesActionsAreAdopted(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	inst := startInstance(t, db)
	id := actionID("r1", "train")
	record(t, inst.client, inCluster("east", event(id, 1, queued, 0, 1)))
	// What the previous release leaves: no cluster on the action or its events.
	execSQL(t, db, `UPDATE actions SET cluster = NULL; UPDATE action_events SET cluster = NULL`)

	if got := getActionIn(t, inst.client, id, proto.String("east")); got.GetPhase() != queued {
		t.Fatalf("the previous release's action under east: %s", stateString(got))
	}
	record(t, inst.client, inCluster("east", event(id, 1, running, 0, 2)))
	var nulls, clusters int
	queryRow(t, db, `SELECT (SELECT count(*) FROM action_events WHERE cluster IS NULL) + (SELECT count(*) FROM actions WHERE cluster IS NULL),
	                        (SELECT count(*) FROM action_events WHERE cluster = 'east') + (SELECT count(*) FROM actions WHERE cluster = 'east')`, &nulls, &clusters)
	if nulls != 0 || clusters != 3 {
		t.Fatalf("after east's event: %d rows without a cluster, %d of east; want 0 and 3 (the action and its 2 events)", nulls, clusters)
	}
	if got := stateString(getActionIn(t, inst.client, id, proto.String("east"))); !strings.HasPrefix(got, "attempt 1 ACTION_PHASE_RUNNING") {
		t.Fatalf("east's adopted action: %s; want running", got)
	}
	if n := len(listEvents(t, inst.client, id, proto.String("east"))); n != 2 {
		t.Fatalf("east's adopted action lists %d events; want 2", n)
	}
	_, err := inst.client.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: id, Cluster: proto.String("west")}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("GetAction of west: %v; want NotFound", err)
	}
	_, err = inst.client.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{inCluster("west", event(id, 1, queued, 0, 3))}}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("west's event of east's adopted action: %v; want InvalidArgument", err)
	}
}

// TestThePreviousReleasesEventOfAnAdoptedActionTakesItsCluster: during a rollout the
// previous release still records events, without the cluster, for actions this release
// has given a cluster (recorded, adopted or back-filled). Each takes its action's
// cluster as it goes in, so that once the next release drops the key of the name alone
// its redelivery is absorbed, rather than kept twice, and the previous release leaves no
// row that the completion of the keys would have to look for among every event.
func TestThePreviousReleasesEventOfAnAdoptedActionTakesItsCluster(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	st, _ := openStore(t, db)
	id := actionID("r1", "train")
	storeRecord(t, st, inCluster("east", event(id, 1, queued, 0, 1)))
	running := inCluster("east", event(id, 1, running, 0, 2))
	encoded, err := proto.Marshal(running)
	if err != nil {
		t.Fatal(err)
	}
	// The previous release's insert of an event (its insert_events.sql), which names no
	// cluster; its fold has locked the action first, in the same transaction.
	pool := openPool(t, db)
	if _, err := pool.Exec(ctx, `INSERT INTO action_events (project, domain, run, action, attempt, phase, version, occurred_at, event, filed_at)
		SELECT project, domain, run, action, 1, $1, 0, now(), $2, filed_at FROM actions
		ON CONFLICT DO NOTHING`, int16(running.GetPhase()), encoded); err != nil {
		t.Fatalf("the previous release's insert: %v", err)
	}
	var nulls int
	queryRow(t, db, `SELECT count(*) FROM action_events WHERE cluster IS NULL`, &nulls)
	if nulls != 0 {
		t.Fatalf("%d events of east's action name no cluster; want each to take its action's", nulls)
	}
	eventsschema.ToTheNextReleasesKeys(t, st, db)
	got, err := st.Record(ctx, []*eventsv1.ActionEvent{running})
	if err != nil || got.Duplicates != 1 {
		t.Fatalf("the redelivery of the previous release's event: %+v, %v; want it absorbed", got, err)
	}
	if evs, _, err := st.ListActionEvents(ctx, store.KeyOf(id), proto.String("east"), store.EventCursor{}, store.Page{Limit: 100, MaxBytes: 1 << 20}); err != nil || len(evs) != 2 {
		t.Fatalf("east's action lists %d events (%v); want 2", len(evs), err)
	}
}

func getActionIn(t *testing.T, c eventsv1connect.EventsServiceClient, id *flytecorev1.ActionIdentifier, cluster *string) *eventsv1.Action {
	t.Helper()
	resp, err := c.GetAction(context.Background(), connect.NewRequest(&eventsv1.GetActionRequest{Id: id, Cluster: cluster}))
	if err != nil {
		t.Fatalf("GetAction(%v, cluster %v): %v", id, cluster, err)
	}
	return resp.Msg.GetAction()
}

func listEvents(t *testing.T, c eventsv1connect.EventsServiceClient, id *flytecorev1.ActionIdentifier, cluster *string) []*eventsv1.ActionEvent {
	t.Helper()
	resp, err := c.ListActionEvents(context.Background(), connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id, Cluster: cluster}))
	if err != nil {
		t.Fatalf("ListActionEvents(%v, cluster %v): %v", id, cluster, err)
	}
	return resp.Msg.GetEvents()
}

func listActions(t *testing.T, c eventsv1connect.EventsServiceClient, cluster *string) []*eventsv1.Action {
	t.Helper()
	resp, err := c.ListActions(context.Background(), connect.NewRequest(&eventsv1.ListActionsRequest{Project: "demo", Domain: "development", Cluster: cluster}))
	if err != nil {
		t.Fatalf("ListActions(cluster %v): %v", cluster, err)
	}
	return resp.Msg.GetActions()
}

func execSQL(t *testing.T, dbURL, sql string) {
	t.Helper()
	pool := openPool(t, dbURL)
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func queryRow(t *testing.T, dbURL, sql string, dest ...any) {
	t.Helper()
	if err := openPool(t, dbURL).QueryRow(context.Background(), sql).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func openPool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := postgres.Open(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("opening the test database: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestMetricsByCluster: the events each cluster sent, and when each last sent one, for
// up to maxClusterLabels clusters; the clusters past those are counted together, so a
// caller naming a new cluster in every event cannot grow the metrics without bound.
func TestMetricsByCluster(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	record(t, inst.client, inCluster("east", event(actionID("r1", "a"), 1, queued, 0, 1)), inCluster("east", event(actionID("r1", "a"), 1, running, 0, 2)))
	record(t, inst.client, inCluster("west", event(actionID("r2", "a"), 1, queued, 0, 1)))
	record(t, inst.client, event(actionID("r3", "a"), 1, queued, 0, 1))
	for i := range 70 {
		record(t, inst.client, inCluster(fmt.Sprintf("c%02d", i), event(actionID(fmt.Sprintf("x%d", i), "a"), 1, queued, 0, 1)))
	}
	inst.RequireMetrics(t,
		`flyte_events_received_by_cluster_total{cluster="east"} 2`,
		`flyte_events_received_by_cluster_total{cluster="west"} 1`,
		`flyte_events_received_by_cluster_total{cluster=""} 1`,
		`flyte_events_received_by_cluster_total{cluster="c60"} 1`,
		// 64 names: east, west, "" and c00 to c60; c61 to c69 are counted together.
		`flyte_events_received_by_cluster_total{cluster="(other)"} 9`,
	)
	n, err := testutil.GatherAndCount(inst.Gatherer(), "flyte_events_cluster_last_event_timestamp_seconds")
	if err != nil || n != 65 {
		t.Errorf("%d series of flyte_events_cluster_last_event_timestamp_seconds (%v); want 65", n, err)
	}
}

// TestTheNextReleasesKeysAreCompleted: what the next release's contract needs before it
// drops the keys of the name alone is done in the background. Each partition that
// existed before the key with the cluster gets its part of it (those made since get
// theirs when attached), and the previous release's actions and their events get the
// cluster their events name. Then, with the old keys dropped, a redelivery is still
// absorbed, by the key with the cluster.
func TestTheNextReleasesKeysAreCompleted(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	st, pool := openStore(t, db)
	var batch []*eventsv1.ActionEvent
	for i := range 3 {
		id := actionID("r1", fmt.Sprintf("a%d", i))
		batch = append(batch, inCluster("east", event(id, 1, queued, 0, 1)), inCluster("east", event(id, 1, running, 0, 2)))
	}
	if _, err := st.Record(ctx, batch); err != nil {
		t.Fatal(err)
	}
	// Two of them as the previous release leaves them.
	execSQL(t, db, `UPDATE actions SET cluster = NULL WHERE action <> 'a0'; UPDATE action_events SET cluster = NULL WHERE action <> 'a0'`)
	keyValid := func() bool {
		var valid bool
		if err := pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'action_events_cluster_key'::regclass`).Scan(&valid); err != nil {
			t.Fatal(err)
		}
		return valid
	}
	if keyValid() {
		t.Fatal("the key with the cluster is valid before the partitions from before it have theirs")
	}

	res, err := st.CompleteClusterKeys(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if res.Skipped || res.Backfilled != 2 || !res.Done || !slices.Contains(res.Keyed, "action_events_before_partitioning") {
		t.Fatalf("first pass: %+v; want the partition from before partitioning keyed and 2 actions given their cluster", res)
	}
	if !keyValid() {
		t.Fatal("the key with the cluster is not valid once every partition has its part")
	}
	var nulls int
	queryRow(t, db, `SELECT (SELECT count(*) FROM actions WHERE cluster IS DISTINCT FROM 'east') + (SELECT count(*) FROM action_events WHERE cluster IS DISTINCT FROM 'east')`, &nulls)
	if nulls != 0 {
		t.Fatalf("%d actions or events without east's cluster after the pass", nulls)
	}
	if res, err := st.CompleteClusterKeys(ctx, 10); err != nil || len(res.Keyed) != 0 || res.Backfilled != 0 || !res.Done {
		t.Fatalf("second pass: %+v, %v; want nothing left to do", res, err)
	}

	execSQL(t, db, `ALTER TABLE actions DROP CONSTRAINT actions_pkey; ALTER TABLE action_events DROP CONSTRAINT action_events_pkey`)
	got, err := st.Record(ctx, batch)
	if err != nil || got.Duplicates != len(batch) {
		t.Fatalf("redelivery without the old keys: %+v, %v; want all %d absorbed", got, err, len(batch))
	}
}

// TestRetentionMovesEachClustersActionApart: on the next release's schema, two clusters'
// actions of one name filed in one partition, one finished and one running. Retention
// deletes the finished one and re-files the running one with its own events alone.
func TestRetentionMovesEachClustersActionApart(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	clk := clocktesting.NewFakeClock(day0)
	st, _ := openStoreAt(t, db, clk)
	eventsschema.ToTheNextReleasesKeys(t, st, db)
	id := actionID("day0", "train")
	storeRecord(t, st, inCluster("east", occurredAt(event(id, 1, running, 0, 0), day0)), inCluster("east", occurredAt(event(id, 1, succeeded, 0, 0), day0.Add(time.Minute))))
	storeRecord(t, st, inCluster("west", occurredAt(event(id, 1, queued, 0, 0), day0)), inCluster("west", occurredAt(event(id, 1, running, 0, 0), day0.Add(time.Second))),
		inCluster("west", occurredAt(event(id, 1, running, 1, 0), day0.Add(2*time.Second))))

	now := day0.Add(48 * time.Hour)
	clk.SetTime(now)
	if _, err := st.MaintainPartitions(ctx, now); err != nil {
		t.Fatal(err)
	}
	res, err := st.DropExpired(ctx, now, 24*time.Hour, 7)
	if err != nil || res.Actions != 1 || res.Refiled != 1 {
		t.Fatalf("retention did %+v (%v); want east's action deleted and west's re-filed", res, err)
	}
	if _, err := st.GetAction(ctx, store.KeyOf(id), proto.String("east")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("east's finished action: %v; want it deleted", err)
	}
	evs, _, err := st.ListActionEvents(ctx, store.KeyOf(id), proto.String("west"), store.EventCursor{}, store.Page{Limit: 100, MaxBytes: 1 << 20})
	if err != nil || len(evs) != 3 {
		t.Fatalf("west's re-filed action lists %d events (%v); want its 3", len(evs), err)
	}
	var left int
	queryRow(t, db, `SELECT count(*) FROM action_events WHERE cluster = 'east'`, &left)
	if left != 0 {
		t.Fatalf("%d of east's events left after its action was deleted", left)
	}
}

// TestTheServiceCompletesTheNextReleasesKeys: a service's maintenance completes the keys
// with the cluster on its own, and says so, for the operator who checks before rolling
// the next release, whose migrations need them.
func TestTheServiceCompletesTheNextReleasesKeys(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	if !inst.WaitForMetric(t, "flyte_events_cluster_keys_complete 1") {
		t.Fatal("the service did not say the keys with the cluster are complete")
	}
}
