package outbox

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
)

var (
	//go:embed queries/dead_letter.sql
	deadLetterSQL string
	//go:embed queries/list_dead_letters.sql
	listDeadLettersSQL string
	//go:embed queries/request_replay.sql
	requestReplaySQL string
	//go:embed queries/read_replays.sql
	readReplaysSQL string
	//go:embed queries/replayed.sql
	replayedSQL string
	//go:embed queries/rejected_again.sql
	rejectedAgainSQL string
	//go:embed queries/count_dead_letters.sql
	countDeadLettersSQL string
)

// ErrInvalidPageToken is returned for a page token ListDeadLetters did not hand out.
var ErrInvalidPageToken = errors.New("outbox: invalid page token")

// DeadLetter is an entry a sink refused for good.
type DeadLetter struct {
	ID    int64
	Sink  string
	Entry Entry
	// Detail is what the sink said the last time it refused the entry.
	Detail   string
	FailedAt time.Time
	// Attempts counts the refusals.
	Attempts int
	// ReplayRequestedAt is when a replay was asked for; zero when none waits.
	ReplayRequestedAt time.Time
}

// DeadLetter keeps e, which sink refused for good, with what the sink said (detail, cut
// to MaxDetailBytes). The same entry refused again by the same sink counts one more
// attempt of the letter already kept.
func (o *Outbox) DeadLetter(ctx context.Context, sink string, e Entry, detail string) error {
	encoded := e.encoded
	if encoded == nil {
		var err error
		if encoded, err = proto.Marshal(e.Event); err != nil {
			return fmt.Errorf("outbox: encoding the dead letter at %s: %w", e.Position, err)
		}
	}
	var occurred *time.Time
	if !e.OccurredAt.IsZero() {
		occurred = &e.OccurredAt
	}
	_, err := o.pool.Exec(ctx, deadLetterSQL, pgx.StrictNamedArgs{
		"sink": sink, "tx": e.Position.Tx, "position": e.Position.Pos, "ordinal": e.Position.Ordinal,
		"project": e.Key.Project, "domain": e.Key.Domain, "run": e.Key.Run, "action": e.Key.Action,
		"attempt": int32(e.Attempt), "phase": int16(e.Phase), "version": int32(e.Version),
		"occurred_at": occurred, "recorded_at": e.RecordedAt, "event": encoded,
		"detail": boundDetail(detail),
	})
	if err != nil {
		return fmt.Errorf("outbox: keeping the dead letter at %s of sink %q: %w", e.Position, sink, err)
	}
	return nil
}

// DeadLetterFilter selects dead letters to list.
type DeadLetterFilter struct {
	// Sink narrows to one sink's letters when not empty.
	Sink string
	// PageSize is the most letters on a page: DefaultPageSize when not positive, at most
	// MaxPageSize.
	PageSize int
	// PageToken continues a listing where the page that returned it ended; empty starts
	// at the first letter.
	PageToken string
}

// Page sizes of ListDeadLetters.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// ListDeadLetters returns a page of dead letters in the order they were first refused,
// and the token of the next page ("" after the last).
func (o *Outbox) ListDeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, string, error) {
	size := f.PageSize
	if size <= 0 {
		size = DefaultPageSize
	}
	size = min(size, MaxPageSize)
	var after int64
	if f.PageToken != "" {
		var err error
		if after, err = strconv.ParseInt(f.PageToken, 10, 64); err != nil || after < 1 {
			return nil, "", ErrInvalidPageToken
		}
	}
	var sink *string
	if f.Sink != "" {
		sink = &f.Sink
	}
	// One more than the page, to know whether another follows.
	letters, err := o.queryDeadLetters(ctx, listDeadLettersSQL, pgx.StrictNamedArgs{"sink": sink, "after": after, "limit": size + 1})
	if err != nil {
		return nil, "", fmt.Errorf("outbox: listing dead letters: %w", err)
	}
	if len(letters) <= size {
		return letters, "", nil
	}
	letters = letters[:size]
	return letters, strconv.FormatInt(letters[size-1].ID, 10), nil
}

// CountDeadLetters returns how many dead letters sink has.
func (o *Outbox) CountDeadLetters(ctx context.Context, sink string) (int64, error) {
	var n int64
	if err := o.pool.QueryRow(ctx, countDeadLettersSQL, pgx.StrictNamedArgs{"sink": sink}).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: counting the dead letters of sink %q: %w", sink, err)
	}
	return n, nil
}

// RequestReplay asks for the dead letters ids of sink, or all of its letters when ids is
// empty, to be published again, and returns how many letters the request names. The
// relay publishes them before the sink's next entries (ReadReplays).
func (o *Outbox) RequestReplay(ctx context.Context, sink string, ids []int64) (int, error) {
	if ids == nil {
		ids = []int64{}
	}
	tag, err := o.pool.Exec(ctx, requestReplaySQL, pgx.StrictNamedArgs{"sink": sink, "ids": ids})
	if err != nil {
		return 0, fmt.Errorf("outbox: requesting a replay for sink %q: %w", sink, err)
	}
	return int(tag.RowsAffected()), nil
}

// ReadReplays returns up to limit of sink's dead letters whose replay was requested, in
// outbox order. Report each one's fate with Replayed or RejectedAgain.
func (o *Outbox) ReadReplays(ctx context.Context, sink string, limit int) ([]DeadLetter, error) {
	if limit < 1 {
		return nil, fmt.Errorf("outbox: reading %d replays: the limit must be positive", limit)
	}
	letters, err := o.queryDeadLetters(ctx, readReplaysSQL, pgx.StrictNamedArgs{"sink": sink, "limit": limit})
	if err != nil {
		return nil, fmt.Errorf("outbox: reading replays for sink %q: %w", sink, err)
	}
	return letters, nil
}

// Replayed deletes dead letter id: its sink took it when it was published again.
func (o *Outbox) Replayed(ctx context.Context, id int64) error {
	if _, err := o.pool.Exec(ctx, replayedSQL, pgx.StrictNamedArgs{"id": id}); err != nil {
		return fmt.Errorf("outbox: deleting replayed dead letter %d: %w", id, err)
	}
	return nil
}

// RejectedAgain records that the sink refused dead letter id again, saying detail (cut
// to MaxDetailBytes); the letter waits for another replay request.
func (o *Outbox) RejectedAgain(ctx context.Context, id int64, detail string) error {
	if _, err := o.pool.Exec(ctx, rejectedAgainSQL, pgx.StrictNamedArgs{"id": id, "detail": boundDetail(detail)}); err != nil {
		return fmt.Errorf("outbox: recording another refusal of dead letter %d: %w", id, err)
	}
	return nil
}

// queryDeadLetters runs a query returning dead letters' columns.
func (o *Outbox) queryDeadLetters(ctx context.Context, sql string, args pgx.StrictNamedArgs) ([]DeadLetter, error) {
	rows, err := o.pool.Query(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	var (
		out      []DeadLetter
		d        DeadLetter
		attempts int32
		replay   *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&d.ID, &d.Sink, &d.Entry.Position.Tx, &d.Entry.Position.Pos, &d.Entry.Position.Ordinal,
		&d.Entry.RecordedAt, &d.Entry.encoded, &d.Detail, &d.FailedAt, &attempts, &replay,
	}, func() error {
		letter := d
		letter.Entry.decode()
		letter.Attempts = int(attempts)
		if replay != nil {
			letter.ReplayRequestedAt = *replay
		}
		out = append(out, letter)
		d.Entry.encoded = nil // a fresh buffer for the next row
		return nil
	})
	return out, err
}
