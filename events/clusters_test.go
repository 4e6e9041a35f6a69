package events_test

import (
	"context"
	"errors"
	"fmt"
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
)

// inCluster is ev sent by the executor of cluster c.
func inCluster(c string, ev *eventsv1.ActionEvent) *eventsv1.ActionEvent {
	ev.Cluster = c
	return ev
}

// TestOneNameInTwoClusters: two clusters' executors record actions of one name. Both
// are kept, neither overwriting the other, and reads tell them apart by cluster (until
// migrations 00018 to 00020 dropped the key of the name alone, the second was refused).
func TestOneNameInTwoClusters(t *testing.T) {
	ctx := context.Background()
	inst := startInstance(t, pg.NewDatabase(t))
	id := actionID("r1", "train")
	other := actionID("r1", "other")
	east := []*eventsv1.ActionEvent{inCluster("east", event(id, 1, queued, 0, 1)), inCluster("east", event(id, 1, running, 0, 2))}
	record(t, inst.client, east...)
	west := inCluster("west", event(id, 1, queued, 0, 3))
	record(t, inst.client, west, inCluster("west", event(other, 1, queued, 0, 3)))
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
	_, err := inst.client.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: id}))
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
}

// TestTheContractNeedsTheKeysWithTheCluster: migrations 00018 to 00020 drop the keys of
// the name alone only where v0.3.0's background work has left nothing for them: every partition
// of action_events keyed with the cluster (those still empty it keys itself, as a new
// database's are) and every action v0.2.0 recorded given its cluster. Else it stops,
// saying what is left, and changes nothing; once that is done, it goes through.
func TestTheContractNeedsTheKeysWithTheCluster(t *testing.T) {
	for _, tc := range []struct {
		name     string
		leave    string // what v0.2.0 and an unfinished v0.3.0 leave, in SQL
		refusal  string
		complete string // what v0.3.0's maintenance does about it, in SQL
	}{
		{name: "a new database"},
		{
			name:     "an action v0.2.0 recorded, not given its cluster",
			leave:    `UPDATE actions SET cluster = NULL; UPDATE action_events SET cluster = NULL`,
			refusal:  "actions recorded by v0.2.0 have no cluster yet",
			complete: `UPDATE actions SET cluster = 'east'; UPDATE action_events SET cluster = 'east'`,
		},
		{
			name: "a partition of events not keyed with the cluster",
			leave: `INSERT INTO action_events (project, domain, run, action, attempt, phase, version, occurred_at, event, filed_at, cluster)
				SELECT project, domain, run, action, 1, 1, 0, now(), event, '-infinity', cluster FROM actions`,
			refusal: "partitions action_events_before_partitioning have no key with the cluster yet",
			complete: `CREATE UNIQUE INDEX action_events_before_partitioning_cluster_key ON action_events_before_partitioning
				(project, domain, run, action, attempt, phase, version, filed_at, cluster) NULLS NOT DISTINCT;
				ALTER INDEX action_events_cluster_key ATTACH PARTITION action_events_before_partitioning_cluster_key`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db := pg.NewDatabase(t)
			pool := openPool(t, db)
			if err := migrateTo(ctx, pool, 17); err != nil {
				t.Fatal(err)
			}
			st := store.New(pool, store.Options{})
			if _, err := st.MaintainPartitions(ctx, time.Now()); err != nil {
				t.Fatal(err)
			}
			id := actionID("r1", "train")
			storeRecord(t, st, inCluster("east", event(id, 1, queued, 0, 1)))
			if tc.leave != "" {
				execSQL(t, db, tc.leave)
				err := migrateTo(ctx, pool, 0)
				if err == nil || !strings.Contains(err.Error(), tc.refusal) || !strings.Contains(err.Error(), "flyte_events_cluster_keys_complete") {
					t.Fatalf("the contract on what is left undone: %v; want it refused, saying %q and what to wait for", err, tc.refusal)
				}
				var keys int
				queryRow(t, db, `SELECT count(*) FROM pg_constraint WHERE conname IN ('actions_pkey', 'action_events_pkey')`, &keys)
				if keys != 2 {
					t.Fatalf("the refused contract left %d of the 2 keys of the name alone", keys)
				}
				execSQL(t, db, tc.complete)
			}
			if err := migrateTo(ctx, pool, 0); err != nil {
				t.Fatalf("the contract once the keys are complete: %v", err)
			}
			var keys int
			var valid bool
			queryRow(t, db, `SELECT (SELECT count(*) FROM pg_constraint WHERE conname IN ('actions_pkey', 'action_events_pkey')),
				(SELECT indisvalid FROM pg_index WHERE indexrelid = 'action_events_cluster_key'::regclass)`, &keys, &valid)
			if keys != 0 || !valid {
				t.Fatalf("after the contract: %d keys of the name alone, the key with the cluster valid: %t; want 0 and true", keys, valid)
			}
			// An action of the name in another cluster is now an action of its own, and
			// a redelivery is still absorbed.
			if got := storeRecord(t, st, inCluster("west", event(id, 1, queued, 0, 1)), inCluster("east", event(id, 1, queued, 0, 1))); got.Recorded != 1 || got.Duplicates != 1 {
				t.Fatalf("west's action and east's redelivery: %+v; want 1 recorded and 1 absorbed", got)
			}
		})
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

// TestRetentionMovesEachClustersActionApart: two clusters'
// actions of one name filed in one partition, one finished and one running. Retention
// deletes the finished one and re-files the running one with its own events alone.
func TestRetentionMovesEachClustersActionApart(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	clk := clocktesting.NewFakeClock(day0)
	st, _ := openStoreAt(t, db, clk)
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
