package cacheclient_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/types"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/cacheclient"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/test/eventually"
)

// expiry is when the holder of ta's reservation loses it unless it heartbeats; it fails
// the test if the reservation is free.
func (e *env) expiry(t *testing.T, c *cacheclient.Cache, ta *flytev1.TaskAction) time.Time {
	t.Helper()
	key, err := c.Key(context.Background(), ta)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.probe.GetOrExtendReservation(context.Background(), connect.NewRequest(&cachev1.GetOrExtendReservationRequest{
		Key: key, OwnerId: "probe", HeartbeatInterval: durationpb.New(time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetAcquired() {
		t.Fatalf("%s's reservation was free", ta.Name)
	}
	return res.Msg.GetReservation().GetExpiresAt().AsTime()
}

// A reservation taken before the cache is started (a reconcile can come first: the
// manager starts its runnables together) is heartbeated from Start on.
func TestAReservationHeldBeforeStartIsHeartbeated(t *testing.T) {
	e := newEnv(t)
	client, err := cacheclient.NewClient(e.svc.URL, rpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := cacheclient.New(client, e.store, cacheclient.Options{Heartbeat: time.Second, Log: slog.New(slog.DiscardHandler)})
	inputs := e.uri("inputs.json")
	e.write(t, inputs, `{"x": 8}`)
	a := e.action("a", inputs)
	if d := c.Lookup(context.Background(), a, e.uri("a/outputs.json")); d.Hit || d.Wait != 0 || !c.Holds(a.UID) {
		t.Fatalf("A's lookup = %+v, want a miss holding the reservation", d)
	}
	first := e.expiry(t, c, a)
	start(t, c)
	var expires time.Time
	eventually.True(t, 30*time.Second, func() bool {
		expires = e.expiry(t, c, a)
		return expires.After(first)
	}, func() string { return fmt.Sprintf("the reservation still expires at %s: not heartbeated", expires) })
}

// The cache is built with what tells it that an action is gone (Options.Exists): a
// reservation whose action no longer exists is released at its next heartbeat.
func TestAGoneActionsReservationIsReleasedAtItsHeartbeat(t *testing.T) {
	e := newEnv(t)
	client, err := cacheclient.NewClient(e.svc.URL, rpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	exists := func(context.Context, types.NamespacedName, types.UID) (bool, error) { return false, nil }
	c := cacheclient.New(client, e.store, cacheclient.Options{Heartbeat: time.Second, Log: slog.New(slog.DiscardHandler), Exists: exists})
	start(t, c)
	inputs := e.uri("inputs.json")
	e.write(t, inputs, `{"x": 9}`)
	a := e.action("a", inputs)
	if d := c.Lookup(context.Background(), a, e.uri("a/outputs.json")); d.Hit || d.Wait != 0 || !c.Holds(a.UID) {
		t.Fatalf("A's lookup = %+v, want a miss holding the reservation", d)
	}
	eventually.True(t, 30*time.Second, func() bool { return !c.Holds(a.UID) },
		func() string { return "the gone action's reservation is still heartbeated" })
	// The release is made by Start's workers, after Holds says false.
	key, err := c.Key(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 30*time.Second, func() bool {
		res, err := e.probe.GetOrExtendReservation(context.Background(), connect.NewRequest(&cachev1.GetOrExtendReservationRequest{
			Key: key, OwnerId: "probe", HeartbeatInterval: durationpb.New(time.Second)}))
		return err == nil && res.Msg.GetAcquired()
	}, func() string { return "the gone action's reservation was not released" })
}
