package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/flytekube/backend/services/postgres"
)

// ErrLedElsewhere is returned by TryLead while another session holds the leadership.
var ErrLedElsewhere = errors.New("outbox: another relay leads")

// Leadership is the relay's leadership of one database: a session-level advisory lock
// (postgres.LockRelayLeader) held by a connection of its own, outside the pool, so that
// it lasts exactly as long as that session. When the connection dies (the process, the
// network, or Postgres ending the session), Postgres releases the lock and another
// replica's TryLead succeeds.
//
// Postgres notices a connection lost in the network only when TCP does (its keepalive
// settings), and the holder notices only at its next Check: for that long, one relay may
// not know that another took over. Both then publish some entries twice, which delivery
// at least once allows; cursors only move forward, so neither loses anything.
type Leadership struct {
	mu   sync.Mutex // pgx.Conn is not safe for concurrent use
	conn *pgx.Conn
}

// TryLead takes the relay's leadership if no other session holds it, returning
// ErrLedElsewhere if one does. It opens its own connection with the pool's settings; the
// caller must Release it.
func (o *Outbox) TryLead(ctx context.Context) (*Leadership, error) {
	cfg := o.pool.Config().ConnConfig // a copy
	cfg.RuntimeParams["application_name"] = "flyte-events-relay-leader"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("outbox: connecting to lead the relay: %w", err)
	}
	locked, err := postgres.TryLock(ctx, conn, postgres.LockRelayLeader)
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("outbox: taking the relay's leadership: %w", err)
	}
	if !locked {
		_ = conn.Close(context.Background())
		return nil, ErrLedElsewhere
	}
	return &Leadership{conn: conn}, nil
}

// Check returns nil while the leadership is held: the session that holds the lock still
// answers. Bound ctx, so that a connection lost in the network fails the check promptly;
// after an error, the leadership must be considered lost (Release it).
func (l *Leadership) Check(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return errors.New("outbox: the relay's leadership was released")
	}
	if err := l.conn.Ping(ctx); err != nil {
		return fmt.Errorf("outbox: the relay's leadership is lost: %w", err)
	}
	return nil
}

// Release gives the leadership up: it unlocks and closes the connection, so that another
// replica may lead at once. Calling it again does nothing.
func (l *Leadership) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return nil
	}
	// Closing alone releases the lock too, but only once the server has ended the
	// session; the unlock frees it before Release returns. It fails only on a session
	// already gone, whose lock went with it.
	_ = postgres.Unlock(ctx, l.conn, postgres.LockRelayLeader)
	err := l.conn.Close(ctx)
	l.conn = nil
	if err != nil {
		return fmt.Errorf("outbox: closing the relay's leadership connection: %w", err)
	}
	return nil
}

// PID is the Postgres backend process of the leadership's session (for logs and tests).
func (l *Leadership) PID() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return 0
	}
	return l.conn.PgConn().PID()
}
