package outbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/flytekube/backend/events/outbox"
	"github.com/flytekube/backend/internal/textbound"
	"github.com/flytekube/backend/test/pgtest"
)

// deadLetters queues n events, reads them for sink and keeps them all as its dead
// letters.
func (e *env) deadLetters(t *testing.T, sink, run string, n int) []outbox.Entry {
	t.Helper()
	for i := range n {
		e.record(t, event(run, "a0", i))
	}
	entries := e.read(t, sink, n)
	if len(entries) != n {
		t.Fatalf("read %d entries; want %d", len(entries), n)
	}
	for _, en := range entries {
		if err := e.box.DeadLetter(context.Background(), sink, en, "HTTP 400: "+name(en)); err != nil {
			t.Fatal(err)
		}
	}
	e.advance(t, sink, entries[n-1].Position)
	return entries
}

func (e *env) list(t *testing.T, f outbox.DeadLetterFilter) ([]outbox.DeadLetter, string) {
	t.Helper()
	letters, next, err := e.box.ListDeadLetters(context.Background(), f)
	if err != nil {
		t.Fatalf("ListDeadLetters(%+v): %v", f, err)
	}
	return letters, next
}

func letterNames(letters []outbox.DeadLetter) []string {
	out := make([]string, len(letters))
	for i, d := range letters {
		out[i] = d.Sink + ":" + name(d.Entry)
	}
	return out
}

func TestDeadLettersListInPages(t *testing.T) {
	e := newEnv(t)
	e.register(t, "http")
	http := e.deadLetters(t, "http", "r1", 5)
	e.register(t, "http", "kafka")
	kafka := e.deadLetters(t, "kafka", "r2", 1)

	var want []string
	for _, en := range http {
		want = append(want, "http:"+name(en))
	}
	var got []string
	pages := 0
	for token := ""; ; pages++ {
		letters, next := e.list(t, outbox.DeadLetterFilter{Sink: "http", PageSize: 2, PageToken: token})
		got = append(got, letterNames(letters)...)
		if next == "" {
			break
		}
		token = next
	}
	if !slices.Equal(got, want) || pages != 2 {
		t.Fatalf("listed %q over %d pages after the first; want %q over 2", got, pages, want)
	}

	for sink, want := range map[string]int64{"http": 5, "kafka": 1, "none": 0} {
		if n, err := e.box.CountDeadLetters(context.Background(), sink); err != nil || n != want {
			t.Errorf("CountDeadLetters(%q) = %d, %v; want %d", sink, n, err, want)
		}
	}

	all, next := e.list(t, outbox.DeadLetterFilter{})
	if len(all) != 6 || next != "" || all[5].Sink != "kafka" || name(all[5].Entry) != name(kafka[0]) {
		t.Fatalf("listing every sink's: %q, next %q; want http's 5 then kafka's", letterNames(all), next)
	}
	d := all[0]
	if d.Detail != "HTTP 400: "+name(http[0]) || d.Attempts != 1 || d.FailedAt.IsZero() || !d.ReplayRequestedAt.IsZero() {
		t.Errorf("letter %+v: want its detail, one attempt, a failure time and no replay request", d)
	}
	if d.Entry.Event == nil || eventName(d.Entry.Event) != name(http[0]) || d.Entry.Position != http[0].Position {
		t.Errorf("letter's entry %s at %s; want the event at %s", name(d.Entry), d.Entry.Position, http[0].Position)
	}
	if _, _, err := e.box.ListDeadLetters(context.Background(), outbox.DeadLetterFilter{PageToken: "x"}); !errors.Is(err, outbox.ErrInvalidPageToken) {
		t.Errorf("a forged page token: %v; want ErrInvalidPageToken", err)
	}
}

func TestDeadLetterOfTheSameEntryCountsAttempts(t *testing.T) {
	e := newEnv(t)
	e.register(t, "http")
	entries := e.deadLetters(t, "http", "r1", 1)
	if err := e.box.DeadLetter(context.Background(), "http", entries[0], "HTTP 422"); err != nil {
		t.Fatal(err)
	}
	letters, _ := e.list(t, outbox.DeadLetterFilter{})
	if len(letters) != 1 || letters[0].Attempts != 2 || letters[0].Detail != "HTTP 422" {
		t.Fatalf("letters %+v; want one, with 2 attempts and the latest detail", letters)
	}
}

func TestDeadLetterDetailIsBounded(t *testing.T) {
	e := newEnv(t)
	e.register(t, "http")
	e.record(t, event("r1", "a0", 0))
	en := e.read(t, "http", 1)[0]
	// 3-byte characters, so the bound falls inside one; a NUL and invalid UTF-8 too.
	detail := "\x00\xff" + strings.Repeat("€", 1000)
	if err := e.box.DeadLetter(context.Background(), "http", en, detail); err != nil {
		t.Fatal(err)
	}
	letters, _ := e.list(t, outbox.DeadLetterFilter{})
	got := letters[0].Detail
	if len(got) > outbox.MaxDetailBytes || len(got) < outbox.MaxDetailBytes-3 || !utf8.ValidString(got) || strings.ContainsRune(got, 0) {
		t.Fatalf("detail of %d bytes (valid UTF-8: %v); want valid, without NUL, cut to at most %d", len(got), utf8.ValidString(got), outbox.MaxDetailBytes)
	}
	if err := e.box.RejectedAgain(context.Background(), letters[0].ID, strings.Repeat("é", 2000)); err != nil {
		t.Fatal(err)
	}
	letters, _ = e.list(t, outbox.DeadLetterFilter{})
	// 2-byte characters and a 3-byte mark of the cut: the bound leaves one byte over.
	if got := letters[0].Detail; len(got) > outbox.MaxDetailBytes || len(got) < outbox.MaxDetailBytes-1 || !strings.HasSuffix(got, textbound.Ellipsis) || !utf8.ValidString(got) {
		t.Fatalf("detail after RejectedAgain: %d bytes; want %d or one less, valid UTF-8, ending in %s", len(got), outbox.MaxDetailBytes, textbound.Ellipsis)
	}
}

func TestReplay(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.register(t, "http", "kafka")
	http := e.deadLetters(t, "http", "r1", 4)
	e.deadLetters(t, "kafka", "r2", 1)
	letters, _ := e.list(t, outbox.DeadLetterFilter{Sink: "http"})

	if rs, err := e.box.ReadReplays(ctx, "http", 10); err != nil || len(rs) != 0 {
		t.Fatalf("replays before any request: %q, %v; want none", letterNames(rs), err)
	}
	// Requested out of order; replayed in outbox order.
	n, err := e.box.RequestReplay(ctx, "http", []int64{letters[2].ID, letters[0].ID})
	if err != nil || n != 2 {
		t.Fatalf("RequestReplay of 2: %d, %v; want 2", n, err)
	}
	if n, err := e.box.RequestReplay(ctx, "http", []int64{letters[0].ID + 1000}); err != nil || n != 0 {
		t.Fatalf("RequestReplay of an unknown id: %d, %v; want 0", n, err)
	}
	rs, err := e.box.ReadReplays(ctx, "http", 10)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"http:" + name(http[0]), "http:" + name(http[2])}; !slices.Equal(letterNames(rs), want) {
		t.Fatalf("replays %q; want %q", letterNames(rs), want)
	}
	if rs[0].ReplayRequestedAt.IsZero() {
		t.Error("a requested replay has no request time")
	}

	// The first is taken, the second refused again.
	if err := e.box.Replayed(ctx, rs[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := e.box.RejectedAgain(ctx, rs[1].ID, "HTTP 409"); err != nil {
		t.Fatal(err)
	}
	if rs, err := e.box.ReadReplays(ctx, "http", 10); err != nil || len(rs) != 0 {
		t.Fatalf("replays after handling both: %q, %v; want none", letterNames(rs), err)
	}
	letters, _ = e.list(t, outbox.DeadLetterFilter{Sink: "http"})
	want := []string{"http:" + name(http[1]), "http:" + name(http[2]), "http:" + name(http[3])}
	if !slices.Equal(letterNames(letters), want) {
		t.Fatalf("letters left %q; want %q", letterNames(letters), want)
	}
	if l := letters[1]; l.Attempts != 2 || l.Detail != "HTTP 409" || !l.ReplayRequestedAt.IsZero() {
		t.Errorf("letter refused again: %+v; want 2 attempts, the new detail, no request waiting", l)
	}

	// No ids: all of the sink's, and none of another's.
	if n, err := e.box.RequestReplay(ctx, "http", nil); err != nil || n != 3 {
		t.Fatalf("RequestReplay of all: %d, %v; want 3", n, err)
	}
	if rs, _ := e.box.ReadReplays(ctx, "http", 2); len(rs) != 2 {
		t.Errorf("ReadReplays with limit 2 returned %d", len(rs))
	}
	if rs, _ := e.box.ReadReplays(ctx, "kafka", 10); len(rs) != 0 {
		t.Errorf("kafka's letters were requested by http's replay: %q", letterNames(rs))
	}
}

// An event whose stored bytes do not decode comes out with DecodeErr, so the relay can
// dead-letter it rather than stop its sink; the letter keeps the bytes.
func TestUndecodableEventBecomesADeadLetter(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.register(t, "http")
	pgtest.Exec(t, e.url, `INSERT INTO action_events (project, domain, run, action, attempt, phase, version, occurred_at, event, filed_at)
		VALUES ('demo', 'development', 'r1', 'a0', 1, 1, 0, now(), '\xff'::bytea, '-infinity')`)
	entries := e.read(t, "http", 10)
	if len(entries) != 1 || entries[0].DecodeErr == nil || entries[0].Event != nil {
		t.Fatalf("read %+v; want one entry with a decoding error", entries)
	}
	if err := e.box.DeadLetter(ctx, "http", entries[0], entries[0].DecodeErr.Error()); err != nil {
		t.Fatal(err)
	}
	letters, _ := e.list(t, outbox.DeadLetterFilter{Sink: "http"})
	if len(letters) != 1 || letters[0].Entry.DecodeErr == nil || letters[0].Entry.Position != entries[0].Position {
		t.Fatalf("letters %+v; want the undecodable entry", letters)
	}
	var stored []byte
	if err := e.pool.QueryRow(ctx, "SELECT event FROM cloudevent_dead_letters").Scan(&stored); err != nil || string(stored) != "\xff" {
		t.Fatalf("the letter keeps %x (%v); want the stored bytes ff", stored, err)
	}
}
