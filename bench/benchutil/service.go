package benchutil

import (
	"context"
	"log/slog"
	"net/http"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flytekube/backend/services/app"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

// StartService runs a service in this process as its binary does (run is
// cacheservice.Run or events.Run), on cfg, logging nowhere, and returns its URL once it
// serves; stop shuts it down, waits for it and is safe to call twice.
func StartService[C any](ctx context.Context, run app.RunFunc[C], cfg C) (url string, stop func() error, err error) {
	ctx, cancel := context.WithCancel(ctx)
	started := make(chan app.Addrs, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, slog.New(slog.DiscardHandler), func(a app.Addrs) { started <- a }) }()
	select {
	case err := <-done:
		cancel()
		return "", nil, err
	case a := <-started:
		var once sync.Once
		var stopErr error
		return "http://" + a.RPC.String(), func() error {
			once.Do(func() { cancel(); stopErr = <-done })
			return stopErr
		}, nil
	}
}

// Clients returns n HTTP/2 clients, each on a connection of its own like separate
// executors, sending token when it is not empty.
func Clients(n int, token string) []*http.Client {
	clients := make([]*http.Client, n)
	for i := range clients {
		clients[i] = servicetest.H2CClient()
		if token != "" {
			clients[i] = servicetest.WithToken(token)
		}
	}
	return clients
}

// Postgres is a throwaway Postgres cluster.
type Postgres struct {
	*pgtest.Server
	// Procs chooses the cluster's processes (the postmaster and its backends), for CPU
	// accounting.
	Procs func(Proc) bool
}

// StartPostgres starts a throwaway cluster; Stop removes it.
func StartPostgres() (*Postgres, error) {
	pg, err := pgtest.Start()
	if err != nil {
		return nil, err
	}
	pid, err := pg.PID()
	if err != nil {
		_ = pg.Stop()
		return nil, err
	}
	return &Postgres{Server: pg, Procs: func(p Proc) bool { return p.PID == pid || p.PPID == pid }}, nil
}

// OpenMigrated opens a pool on the database at url and applies m, as the service does at
// start, for a bench to load and read its tables directly.
func OpenMigrated(ctx context.Context, url string, m postgres.Migrations) (*pgxpool.Pool, error) {
	pool, err := postgres.Open(ctx, url)
	if err != nil {
		return nil, err
	}
	if _, err := postgres.Migrate(ctx, pool, m, slog.New(slog.DiscardHandler)); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}
