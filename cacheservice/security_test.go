package cacheservice_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flytekube/backend/cacheservice"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

// executorTokens writes a token file, in kube-apiserver's static token format, for
// identities in the executors' group (which may hold reservations), and returns the
// file and each identity's token.
func executorTokens(t *testing.T, identities ...string) (file string, tokens map[string]string) {
	t.Helper()
	tokens = map[string]string{}
	var lines strings.Builder
	for i, id := range identities {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		tokens[id] = hex.EncodeToString(b)
		fmt.Fprintf(&lines, "%s,%s,uid-%d,%q\n", tokens[id], id, i, auth.Executors)
	}
	file = filepath.Join(t.TempDir(), "tokens.csv")
	if err := os.WriteFile(file, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return file, tokens
}

// TestReservationsCannotBeStolen: an owner_id is guessable (the executor's is the action's
// namespace, name and UID), so knowing it must not let another identity extend or
// release the reservation, and a refused caller must not learn it. Once the holder stops
// heartbeating, anyone allowed to hold reservations takes it over.
func TestReservationsCannotBeStolen(t *testing.T) {
	const heartbeat = 100 * time.Millisecond
	tokenFile, tokens := executorTokens(t, "executor", "intruder")
	inst := startInstance(t, pg.NewDatabase(t), func(c *cacheservice.Config) {
		c.Auth = auth.Config{Mode: auth.ModeTokenFile, TokenFile: tokenFile}
		c.MaxHeartbeat, c.HeartbeatGraceMultiplier = heartbeat, 2
		c.CleanupInterval = time.Hour // keep the expired reservation for the takeover
	})
	clients := map[string]cachev1connect.CacheServiceClient{}
	for id, tok := range tokens {
		clients[id] = cachev1connect.NewCacheServiceClient(servicetest.WithToken(tok), inst.URL, connect.WithGRPC())
	}
	ctx := context.Background()
	k := key("demo.train", "1", "inputs-a")
	const victim = "flyte/train-a/0b7d4c1e" // the executor's owner_id for its action

	steps := []struct {
		name        string
		as, owner   string
		release     bool // else GetOrExtendReservation
		waitExpiry  bool // sleep until the current reservation has expired first
		wantGranted bool // acquired, or released
	}{
		{name: "the executor reserves", as: "executor", owner: victim, wantGranted: true},
		{name: "the intruder extends with the victim's owner_id", as: "intruder", owner: victim},
		{name: "the intruder releases with the victim's owner_id", as: "intruder", owner: victim, release: true},
		{name: "the intruder asks under its own owner_id", as: "intruder", owner: "intruder-1"},
		{name: "the executor still holds it", as: "executor", owner: victim, wantGranted: true},
		{name: "the executor under another owner_id is refused", as: "executor", owner: "flyte/train-b/5e1f"},
		{name: "once expired, the intruder takes it over", as: "intruder", owner: "intruder-1", waitExpiry: true, wantGranted: true},
		{name: "the former holder no longer extends", as: "executor", owner: victim},
		{name: "the former holder no longer releases", as: "executor", owner: victim, release: true},
		{name: "the new holder releases", as: "intruder", owner: "intruder-1", release: true, wantGranted: true},
	}
	var expiresAt time.Time
	for _, s := range steps {
		c := clients[s.as]
		if s.waitExpiry {
			time.Sleep(time.Until(expiresAt) + 50*time.Millisecond)
		}
		if s.release {
			resp, err := c.ReleaseReservation(ctx, connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: k, OwnerId: s.owner}))
			if err != nil || resp.Msg.GetReleased() != s.wantGranted {
				t.Fatalf("%s: released %v, %v; want %v", s.name, resp.Msg.GetReleased(), err, s.wantGranted)
			}
			continue
		}
		resp, err := reserve(ctx, c, k, s.owner, heartbeat)
		if err != nil || resp.GetAcquired() != s.wantGranted {
			t.Fatalf("%s: %v, %v; want acquired %v", s.name, resp, err, s.wantGranted)
		}
		res := resp.GetReservation()
		wantOwner := "" // a refusal does not say whom to impersonate
		if s.wantGranted {
			wantOwner = s.owner
			expiresAt = res.GetExpiresAt().AsTime()
		}
		if res.GetOwnerId() != wantOwner {
			t.Fatalf("%s: the reply names owner %q; want %q", s.name, res.GetOwnerId(), wantOwner)
		}
		// A waiter still learns when to look again.
		if res.GetHeartbeatInterval().AsDuration() != heartbeat || !res.GetExpiresAt().AsTime().Equal(expiresAt) {
			t.Fatalf("%s: heartbeat %s, expiry %s; want %s, %s", s.name, res.GetHeartbeatInterval().AsDuration(),
				res.GetExpiresAt().AsTime(), heartbeat, expiresAt)
		}
	}
}

// TestTinyHeartbeatsAreGrantedTheMinimum: a heartbeat below the server's minimum would
// make a reservation that expires as it is granted (a nanosecond is stored as 0 s), so
// that every caller takes it over; the server grants its minimum instead.
func TestTinyHeartbeatsAreGrantedTheMinimum(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t)) // defaults: at least 1s, at most 10s, 3 heartbeats of grace
	ctx := context.Background()
	tests := []struct {
		asked, want time.Duration
	}{
		{time.Nanosecond, time.Second},
		{time.Microsecond, time.Second},
		{999 * time.Millisecond, time.Second},
		{1500 * time.Millisecond, 1500 * time.Millisecond},
		{time.Hour, 10 * time.Second},
	}
	for i, tt := range tests {
		t.Run(tt.asked.String(), func(t *testing.T) {
			before := time.Now()
			resp, err := reserve(ctx, inst.client, key("demo.train", "1", fmt.Sprintf("inputs-%d", i)), "owner-a", tt.asked)
			if err != nil {
				t.Fatal(err)
			}
			res := resp.GetReservation()
			if got := res.GetHeartbeatInterval().AsDuration(); got != tt.want {
				t.Fatalf("asked %s, granted %s; want %s", tt.asked, got, tt.want)
			}
			if lasts := res.GetExpiresAt().AsTime().Sub(before); lasts < 3*tt.want-time.Second {
				t.Fatalf("the reservation lasts %s; want about 3 heartbeats of %s", lasts, tt.want)
			}
		})
	}
}

// withInvalidUTF8 marshals m, whose placeholder string stands where the bad text goes,
// and puts bytes that are not UTF-8 in its place: Go's protobuf refuses to send those,
// other clients do not.
func withInvalidUTF8(t *testing.T, m proto.Message, placeholder string) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(placeholder)) {
		t.Fatalf("placeholder %q not in the message", placeholder)
	}
	return bytes.Replace(b, []byte(placeholder), bytes.Repeat([]byte{0xff}, len(placeholder)), 1)
}

// TestBadTextIsInvalidArgumentNamingTheField: Postgres text holds neither NUL nor invalid
// UTF-8; either must be refused as the caller's mistake, naming the field, and never
// reach the database (which answers with an SQLSTATE).
func TestBadTextIsInvalidArgumentNamingTheField(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db)
	c := inst.client
	ctx := context.Background()
	const bad = "PLACEHOLDER"
	badKey := func(mutate func(*cachev1.CacheKey)) *cachev1.CacheKey {
		k := key("demo.train", "1", "inputs-a")
		mutate(k)
		return k
	}
	const svc = "/flyte.cache.v1.CacheService/"
	tests := []refusal{
		{"NUL in a reservation's owner_id", func() error {
			_, err := reserve(ctx, c, key("demo.train", "1", "x"), "owner\x00a", time.Second)
			return err
		}, "owner_id:"},
		{"NUL in a release's owner_id", func() error {
			_, err := c.ReleaseReservation(ctx, connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: key("demo.train", "1", "x"), OwnerId: "owner\x00a"}))
			return err
		}, "owner_id:"},
		{"NUL in output_uri", func() error {
			_, err := put(ctx, c, key("demo.train", "1", "x"), "s3://bucket/out\x00puts")
			return err
		}, "output_uri:"},
		{"invalid UTF-8 in a reservation's owner_id", func() error {
			return inst.PostUnary(t, svc+"GetOrExtendReservation", withInvalidUTF8(t, &cachev1.GetOrExtendReservationRequest{
				Key: key("demo.train", "1", "x"), OwnerId: bad, HeartbeatInterval: durationpb.New(time.Second)}, bad))
		}, "owner_id: not valid UTF-8"},
		{"invalid UTF-8 in a release's owner_id", func() error {
			return inst.PostUnary(t, svc+"ReleaseReservation", withInvalidUTF8(t, &cachev1.ReleaseReservationRequest{
				Key: key("demo.train", "1", "x"), OwnerId: bad}, bad))
		}, "owner_id: not valid UTF-8"},
		{"invalid UTF-8 in output_uri", func() error {
			return inst.PostUnary(t, svc+"Put", withInvalidUTF8(t, &cachev1.PutRequest{
				Key: key("demo.train", "1", "x"), OutputUri: "s3://b/" + bad, SourceAction: source("a0"), SourceAttempt: 1}, bad))
		}, "output_uri: not valid UTF-8"},
		{"invalid UTF-8 in the source action", func() error {
			src := source("a0")
			src.Run = bad
			return inst.PostUnary(t, svc+"Put", withInvalidUTF8(t, &cachev1.PutRequest{
				Key: key("demo.train", "1", "x"), OutputUri: "s3://b/o", SourceAction: src, SourceAttempt: 1}, bad))
		}, "source_action.run: not valid UTF-8"},
		// JSON's decoder names the position of bad text rather than its field.
		{"invalid UTF-8 in JSON", func() error {
			return inst.PostUnary(t, svc+"ReleaseReservation", []byte(`{"key":{"project":"demo","domain":"development",`+
				`"taskName":"demo.train","cacheVersion":"1","signature":"s","inputsHash":"i"},"ownerId":"o`+"\xff"+`"}`))
		}, "(line 1:136): invalid UTF-8"},
		{"invalid UTF-8 in a key's task_name", func() error {
			return inst.PostUnary(t, svc+"Get", withInvalidUTF8(t, &cachev1.GetRequest{
				Key: badKey(func(k *cachev1.CacheKey) { k.TaskName = bad })}, bad))
		}, "key.task_name: not valid UTF-8"},
		{"invalid UTF-8 in a key's project", func() error {
			return inst.PostUnary(t, svc+"Delete", withInvalidUTF8(t, &cachev1.DeleteRequest{
				Key: badKey(func(k *cachev1.CacheKey) { k.Project = bad })}, bad))
		}, "key.project: not valid UTF-8"},
		{"invalid UTF-8 in Invalidate's cache_version", func() error {
			return inst.PostUnary(t, svc+"Invalidate", withInvalidUTF8(t, &cachev1.InvalidateRequest{
				Project: "demo", Domain: "development", TaskName: "demo.train", CacheVersion: bad}, bad))
		}, "cache_version: not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v; want InvalidArgument naming %s", err, tt.want)
			}
			if strings.Contains(err.Error(), "SQLSTATE") {
				t.Fatalf("the error carries the database's answer: %v", err)
			}
		})
	}
	requireNothingStored(t, db)
}

// TestStoredValuesAreBounded: every value stored has a bound in the contract, checked
// before anything is written; an attempt beyond what the executor can produce would be
// stored as a negative integer.
func TestStoredValuesAreBounded(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db)
	c := inst.client
	ctx := context.Background()
	tests := []refusal{
		{"output_uri over 2048 characters", func() error {
			_, err := put(ctx, c, key("demo.train", "1", "x"), "s3://b/"+strings.Repeat("o", 2048))
			return err
		}, "output_uri"},
		{"owner_id over 256 characters", func() error {
			_, err := reserve(ctx, c, key("demo.train", "1", "x"), strings.Repeat("o", 257), time.Second)
			return err
		}, "owner_id"},
		{"source_attempt past the executor's attempts", func() error {
			_, err := put(ctx, c, key("demo.train", "1", "x"), "s3://b/o", func(r *cachev1.PutRequest) { r.SourceAttempt = 112 })
			return err
		}, "source_attempt"},
		{"source_attempt past int32", func() error {
			_, err := put(ctx, c, key("demo.train", "1", "x"), "s3://b/o", func(r *cachev1.PutRequest) { r.SourceAttempt = 1 << 31 })
			return err
		}, "source_attempt"},
	}
	requireRefused(t, tests)
	requireNothingStored(t, db)
}

// withUnknownField returns k carrying n bytes of a field the contract does not have.
func withUnknownField(k *cachev1.CacheKey, n int) *cachev1.CacheKey {
	var raw []byte
	raw = protowire.AppendTag(raw, 999, protowire.BytesType)
	raw = protowire.AppendBytes(raw, bytes.Repeat([]byte("u"), n))
	k.ProtoReflect().SetUnknown(raw)
	return k
}

// TestUnknownFieldsAreNeitherStoredNorEchoed: the store keeps entries and reservations
// in columns, so unknown fields have nowhere to go; no answer may carry them back either.
func TestUnknownFieldsAreNeitherStoredNorEchoed(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	ctx := context.Background()
	k := withUnknownField(key("demo.train", "1", "inputs-a"), 1000)

	res, err := reserve(ctx, inst.client, k, "owner-a", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if u := res.GetReservation().GetKey().ProtoReflect().GetUnknown(); len(u) != 0 {
		t.Fatalf("the reservation's key came back with %d bytes of unknown fields", len(u))
	}
	if _, err := put(ctx, inst.client, k, "s3://b/o"); err != nil {
		t.Fatal(err)
	}
	got, err := inst.client.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: key("demo.train", "1", "inputs-a")}))
	if err != nil {
		t.Fatal(err)
	}
	if u := got.Msg.GetOutput().GetKey().ProtoReflect().GetUnknown(); len(u) != 0 {
		t.Fatalf("the entry's key came back with %d bytes of unknown fields", len(u))
	}
}

// TestOversizedRequestsAreRefused: the largest valid cache request is a few kilobytes
// (every field is bounded), so a bigger one is padding that only costs memory.
func TestOversizedRequestsAreRefused(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	_, err := inst.client.Get(context.Background(), connect.NewRequest(&cachev1.GetRequest{Key: withUnknownField(key("demo.train", "1", "x"), 1<<20)}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("a 1 MiB Get: %v; want ResourceExhausted", err)
	}
}

// TestErrorsCarryNoDatabaseDetails: a failing database must not tell callers where it
// is, who the service logs in as, or what it answered: that goes to the log.
func TestErrorsCarryNoDatabaseDetails(t *testing.T) {
	own := pgtest.New(t) // its own cluster: the shared one must stay up for other tests
	db := own.NewDatabase(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{"SQLSTATE", u.User.Username(), strings.TrimPrefix(u.Path, "/"), "cached_outputs", "reservations"}
	// Where it is: a TCP host and port, or the directory of its Unix socket (hack/postgres.sh).
	for _, where := range []string{u.Hostname(), u.Port(), u.Query().Get("host")} {
		if where != "" {
			secrets = append(secrets, where)
		}
	}
	inst := startInstance(t, db)
	ctx := context.Background()
	get := func() error {
		_, err := inst.client.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: key("demo.train", "1", "x")}))
		return err
	}
	requireClean := func(what string, err error, want connect.Code) {
		t.Helper()
		if connect.CodeOf(err) != want {
			t.Fatalf("%s: %v; want %s", what, err, want)
		}
		for _, s := range secrets {
			if strings.Contains(err.Error(), s) {
				t.Errorf("%s: the error names %q: %v", what, s, err)
			}
		}
	}

	pgtest.Exec(t, db, "ALTER TABLE cached_outputs RENAME TO cached_outputs_gone")
	requireClean("Get with its table gone", get(), connect.CodeInternal)

	if err := own.Pause(); err != nil {
		t.Fatal(err)
	}
	requireClean("Get during an outage", get(), connect.CodeUnavailable)
	if err := own.Resume(); err != nil { // for the database's cleanup
		t.Fatal(err)
	}
}

func TestHeartbeatBoundsAreChecked(t *testing.T) {
	tests := []struct {
		name    string
		cfg     cacheservice.Config
		wantErr string
	}{
		{"defaults", cacheservice.Config{}, ""},
		{"a short maximum lowers the default minimum", cacheservice.Config{MaxHeartbeat: 100 * time.Millisecond}, ""},
		{"minimum above the maximum", cacheservice.Config{MinHeartbeat: 20 * time.Second}, "min-heartbeat"},
		{"minimum below a millisecond", cacheservice.Config{MinHeartbeat: time.Microsecond}, "min-heartbeat"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.DatabaseURL, tt.cfg.Auth = "postgres://unused", auth.Config{Mode: auth.ModeNone}
			err := tt.cfg.WithDefaults().Validate()
			if (tt.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Validate() = %v; want an error naming %q", err, tt.wantErr)
			}
		})
	}
}

// TestExtremeMaxAgesAreHandled: max_age has no upper bound in the contract, and a
// Duration sent as binary protobuf may lie outside Duration's own range; the store must
// neither overflow the database's time arithmetic nor fail.
func TestExtremeMaxAgesAreHandled(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	ctx := context.Background()
	k := key("demo.train", "1", "inputs-a")
	if _, err := put(ctx, inst.client, k, "s3://b/o"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*durationpb.Duration{
		{Nanos: 1},
		{Seconds: 315_576_000_000}, // Duration's largest valid value, 10,000 years
		{Seconds: 1 << 62},         // beyond it
		{Seconds: 1, Nanos: -999_999_999},
	} {
		t.Run(d.String(), func(t *testing.T) {
			_, err := inst.client.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: k, MaxAge: d}))
			if code := connect.CodeOf(err); err != nil && code != connect.CodeNotFound && code != connect.CodeInvalidArgument {
				t.Fatalf("Get with max_age %v: %v", d, err)
			}
			_, err = put(ctx, inst.client, k, "s3://b/o", func(r *cachev1.PutRequest) { r.MaxAge = d })
			if code := connect.CodeOf(err); err != nil && code != connect.CodeAlreadyExists && code != connect.CodeInvalidArgument {
				t.Fatalf("Put with max_age %v: %v", d, err)
			}
		})
	}
}

// TestReservationsCannotBeStolenAcrossClusters: two clusters' executors often run as
// ServiceAccounts of the same name; one cluster's, knowing the other's owner_id, may not
// extend or release its reservation, since a name means something only in the cluster
// that issued it.
func TestReservationsCannotBeStolenAcrossClusters(t *testing.T) {
	const name = "system:serviceaccount:flyte:flyte-executor"
	tokens := map[string]string{}
	var lines strings.Builder
	for i, cluster := range []string{"east", "west"} {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		tokens[cluster] = hex.EncodeToString(b)
		fmt.Fprintf(&lines, "%s,%s,uid-%d,%q\n", tokens[cluster], name, i, auth.Executors+","+auth.ClusterGroupPrefix+cluster)
	}
	tokenFile := filepath.Join(t.TempDir(), "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	inst := startInstance(t, pg.NewDatabase(t), func(c *cacheservice.Config) {
		c.Auth = auth.Config{Mode: auth.ModeTokenFile, TokenFile: tokenFile}
	})
	client := func(cluster string) cachev1connect.CacheServiceClient {
		return cachev1connect.NewCacheServiceClient(servicetest.WithToken(tokens[cluster]), inst.URL, connect.WithGRPC())
	}
	ctx := context.Background()
	k := key("demo.train", "1", "inputs-across-clusters")
	const victim = "flyte/train-a/0b7d4c1e"
	if resp, err := reserve(ctx, client("east"), k, victim, time.Minute); err != nil || !resp.GetAcquired() {
		t.Fatalf("east reserves: %v, %v", resp, err)
	}
	if resp, err := reserve(ctx, client("west"), k, victim, time.Minute); err != nil || resp.GetAcquired() {
		t.Errorf("west extends east's reservation with its owner_id: %v, %v; want refused", resp, err)
	}
	resp, err := client("west").ReleaseReservation(ctx, connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: k, OwnerId: victim}))
	if err != nil || resp.Msg.GetReleased() {
		t.Errorf("west releases east's reservation: %v, %v; want refused", resp, err)
	}
	if resp, err := reserve(ctx, client("east"), k, victim, time.Minute); err != nil || !resp.GetAcquired() {
		t.Errorf("east still holds it: %v, %v", resp, err)
	}
}
