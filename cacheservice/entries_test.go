package cacheservice_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
)

func TestGetPutDelete(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	ctx := context.Background()
	k := key("demo.train", "1", "inputs-a")

	if _, err := inst.client.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: k})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("Get before Put: %v; want NotFound", err)
	}
	first, err := put(ctx, inst.client, k, "s3://bucket/r1/a0/outputs")
	if err != nil {
		t.Fatal(err)
	}
	got, err := inst.client.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: k}))
	if err != nil {
		t.Fatal(err)
	}
	out := got.Msg.GetOutput()
	if out.GetOutputUri() != "s3://bucket/r1/a0/outputs" || out.GetSourceAction().GetAction() != "a0" || out.GetSourceAttempt() != 1 ||
		out.GetKey().GetInputsHash() != "inputs-a" || out.GetCreatedAt() == nil {
		t.Fatalf("Get = %v", out)
	}

	// A second Put is refused; overwrite replaces, keeping created_at.
	if _, err := put(ctx, inst.client, k, "s3://bucket/other"); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("second Put: %v; want AlreadyExists", err)
	}
	replaced, err := put(ctx, inst.client, k, "s3://bucket/r2/a0/outputs", func(r *cachev1.PutRequest) { r.Overwrite = true; r.SourceAttempt = 2 })
	if err != nil {
		t.Fatal(err)
	}
	if replaced.GetOutputUri() != "s3://bucket/r2/a0/outputs" || replaced.GetSourceAttempt() != 2 ||
		!replaced.GetCreatedAt().AsTime().Equal(first.GetCreatedAt().AsTime()) || !replaced.GetUpdatedAt().AsTime().After(first.GetUpdatedAt().AsTime()) {
		t.Fatalf("overwrite: %v (first %v)", replaced, first)
	}

	// Max age: an entry older than the caller's max age is a miss, and may be replaced.
	time.Sleep(20 * time.Millisecond)
	if _, err := inst.client.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: k, MaxAge: durationpb.New(10 * time.Millisecond)})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("Get with a short max age: %v; want NotFound", err)
	}
	if _, err := inst.client.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: k, MaxAge: durationpb.New(time.Hour)})); err != nil {
		t.Fatalf("Get with a long max age: %v", err)
	}
	if _, err := put(ctx, inst.client, k, "s3://x", func(r *cachev1.PutRequest) { r.MaxAge = durationpb.New(time.Hour) }); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("Put over a fresh entry with max age: %v; want AlreadyExists", err)
	}
	if _, err := put(ctx, inst.client, k, "s3://bucket/r3", func(r *cachev1.PutRequest) { r.MaxAge = durationpb.New(10 * time.Millisecond) }); err != nil {
		t.Fatalf("Put over a stale entry with max age: %v", err)
	}

	del, err := inst.client.Delete(ctx, connect.NewRequest(&cachev1.DeleteRequest{Key: k}))
	if err != nil || !del.Msg.GetDeleted() {
		t.Fatalf("Delete = %v, %v", del, err)
	}
	del, err = inst.client.Delete(ctx, connect.NewRequest(&cachev1.DeleteRequest{Key: k}))
	if err != nil || del.Msg.GetDeleted() {
		t.Fatalf("second Delete = %v, %v; want deleted=false and no error", del, err)
	}

	inst.RequireMetrics(t,
		`flyte_cache_gets_total{result="hit"} 2`,
		`flyte_cache_gets_total{result="miss"} 2`,
		`flyte_cache_puts_total{result="stored"} 1`,
		`flyte_cache_puts_total{result="replaced"} 2`,
		`flyte_cache_puts_total{result="conflict"} 2`,
		`flyte_cache_entries_deleted_total 1`,
	)
}

func TestConcurrentPutsHaveOneWinner(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	ctx := context.Background()
	const writers = 24
	for round := range 5 {
		k := key("demo.train", "1", fmt.Sprintf("round-%d", round))
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []string
		)
		for w := range writers {
			wg.Go(func() {
				uri := fmt.Sprintf("s3://bucket/writer-%d", w)
				_, err := put(ctx, inst.client, k, uri)
				switch {
				case err == nil:
					mu.Lock()
					winners = append(winners, uri)
					mu.Unlock()
				case connect.CodeOf(err) == connect.CodeAlreadyExists:
				default:
					t.Errorf("writer %d: %v", w, err)
				}
			})
		}
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("round %d: %d Puts succeeded (%v); want exactly 1", round, len(winners), winners)
		}
		got, err := inst.client.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: k}))
		if err != nil || got.Msg.GetOutput().GetOutputUri() != winners[0] {
			t.Fatalf("round %d: stored %v, %v; want the winner's %s", round, got, err, winners[0])
		}
	}
}

func TestInvalidate(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	ctx := context.Background()
	for _, k := range []struct{ task, version string }{
		{"demo.train", "1"}, {"demo.train", "1"}, {"demo.train", "2"}, {"demo.eval", "1"},
	} {
		if _, err := put(ctx, inst.client, key(k.task, k.version, fmt.Sprintf("in-%d", time.Now().UnixNano())), "s3://x"); err != nil {
			t.Fatal(err)
		}
	}
	invalidate := func(task, version string) uint64 {
		t.Helper()
		resp, err := inst.client.Invalidate(ctx, connect.NewRequest(&cachev1.InvalidateRequest{Project: "demo", Domain: "development", TaskName: task, CacheVersion: version}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.GetDeleted()
	}
	if n := invalidate("demo.train", "1"); n != 2 {
		t.Fatalf("invalidating version 1 deleted %d; want 2", n)
	}
	if n := invalidate("demo.train", ""); n != 1 {
		t.Fatalf("invalidating the task deleted %d; want the 1 left", n)
	}
	if n := invalidate("demo.eval", ""); n != 1 {
		t.Fatalf("the other task lost entries: %d left; want 1", n)
	}
}

// TestEntryWithoutOutputs: a task that succeeded without outputs is remembered with an
// empty output URI.
func TestEntryWithoutOutputs(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	ctx := context.Background()
	k := key("demo.check", "1", "inputs-a")
	if _, err := put(ctx, inst.client, k, ""); err != nil {
		t.Fatalf("Put without outputs: %v", err)
	}
	got, err := inst.client.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: k}))
	if err != nil || got.Msg.GetOutput().GetOutputUri() != "" || got.Msg.GetOutput().GetSourceAction().GetAction() != "a0" {
		t.Fatalf("Get = %v, %v; want the entry, without outputs", got, err)
	}
}
