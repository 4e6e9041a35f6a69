package events_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flytekube/backend/events/store"
)

// TestListActionsWalksTheIndexOfItsFilters: ListActions is one statement whatever its
// filters, and Postgres must still plan each call for its own, so that a run's listing
// walks actions_by_run; one plan made for any filters walks actions_by_domain for a run
// too, through every newer action of the domain (list_actions.sql). auto_explain sends
// the plan of each call to the client as a notice.
func TestListActionsWalksTheIndexOfItsFilters(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	_, setup := openStore(t, db) // migrates
	// 200 runs of 100 actions, the first of every ten still running.
	if _, err := setup.Exec(ctx, `
INSERT INTO actions (project, domain, run, action, attempt, phase, version, rank, occurred_at, created_at, event, filed_at)
SELECT 'demo', 'development', 'r' || (i / 100), 'a' || (i % 100), 1,
       CASE WHEN i % 10 = 0 THEN 4 ELSE 6 END, 0, CASE WHEN i % 10 = 0 THEN 4 ELSE 5 END, now(), now(), '', now()
FROM generate_series(0, 19999) i;
ANALYZE actions`); err != nil {
		t.Fatal(err)
	}

	cfg, err := pgxpool.ParseConfig(db)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // so the prepared statements checked below are the calls'
	var (
		mu    sync.Mutex
		plans []string
	)
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		plans = append(plans, n.Message)
	}
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; SET auto_explain.log_level = notice")
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st := store.New(pool)

	page := store.Page{Limit: 100, MaxBytes: 1 << 20}
	tests := []struct {
		name   string
		filter store.ActionFilter
		after  int64
		index  string
	}{
		{"domain", store.ActionFilter{Project: "demo", Domain: "development"}, 0, "actions_by_domain"},
		{"domain and phase", store.ActionFilter{Project: "demo", Domain: "development", Phase: running}, 0, "actions_by_domain"},
		{"the oldest run", store.ActionFilter{Project: "demo", Domain: "development", Run: "r0"}, 0, "actions_by_run"},
		{"run, phase and cursor", store.ActionFilter{Project: "demo", Domain: "development", Run: "r1", Phase: running}, 150, "actions_by_run"},
	}
	// Each case runs often enough that Postgres, given a prepared statement, would have
	// settled on one plan for all of them.
	for range 3 {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				mu.Lock()
				plans = nil
				mu.Unlock()
				if _, _, err := st.ListActions(ctx, tt.filter, tt.after, page); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				defer mu.Unlock()
				if len(plans) != 1 {
					t.Fatalf("got %d plans; want the one of ListActions:\n%s", len(plans), strings.Join(plans, "\n"))
				}
				if !strings.Contains(plans[0], "Index Scan using "+tt.index+" on actions") {
					t.Errorf("ListActions does not walk %s:\n%s", tt.index, plans[0])
				}
			})
		}
	}

	rows, err := pool.Query(ctx, "SELECT statement FROM pg_prepared_statements", pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	statements, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range statements {
		if strings.Contains(s, "ListActions") {
			t.Error("ListActions' statement is prepared, so Postgres may plan it once for every filter")
		}
	}
}
