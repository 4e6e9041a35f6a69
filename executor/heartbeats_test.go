package executor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/cacheservice"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/cacheclient"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

// A running serializable action's reservation is heartbeated for as long as the action
// runs, and no longer than the executor: once its manager has stopped, the heartbeats
// have stopped too, and the reservation lapses for another owner to take.
func TestReservationHeartbeatsStopWithTheManager(t *testing.T) {
	// Short heartbeats, so that a reservation lapses within a second of its last one.
	const beat = 300 * time.Millisecond
	svc := servicetest.Run(t, cacheservice.Run, cacheservice.Config{Listen: "127.0.0.1:0", DatabaseURL: pgtest.New(t).NewDatabase(t),
		MaxHeartbeat: beat, Auth: auth.Config{Mode: auth.ModeNone}})
	probe, err := cacheclient.NewClient(svc.URL, rpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.CacheServiceURL = svc.URL
	cfg.Storage.AllowedPrefixes = []string{"mem://out/"}
	ns := env.Namespace(t)
	stop, _ := start(t, cfg, ns, runOptions{})

	ta := &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: "held", Namespace: ns},
		Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "run-held", ActionName: "held",
			TaskName: "demo.sleep-" + ns, TaskType: "core-sleep", Config: map[string]string{"duration": "1h"},
			RunOutputBase: "mem://out/" + ns + "/run-held",
			Cache:         &flytev1.CacheSpec{Enabled: true, Version: "1", Serializable: true}},
	}
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)
	hash, err := cacheclient.InputsHash(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := &cachev1.CacheKey{Project: ta.Spec.Project, Domain: ta.Spec.Domain, TaskName: ta.Spec.TaskName,
		CacheVersion: ta.Spec.Cache.Version, Signature: cacheclient.Signature(&ta.Spec), InputsHash: hash}
	// take tries to take the reservation as another owner; it tells when the holder's
	// runs out when it cannot.
	take := func() (acquired bool, holderExpires time.Time) {
		res, err := probe.GetOrExtendReservation(context.Background(), connect.NewRequest(&cachev1.GetOrExtendReservationRequest{
			Key: key, OwnerId: "probe", HeartbeatInterval: durationpb.New(beat)}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetAcquired(), res.Msg.GetReservation().GetExpiresAt().AsTime()
	}

	// While the action runs, its reservation is held and extended, beat after beat.
	acquired, first := take()
	if acquired {
		t.Fatal("the running action's reservation was free")
	}
	var expires time.Time
	eventually.True(t, 30*time.Second, func() bool {
		acquired, expires = take()
		return !acquired && expires.After(first.Add(2*beat))
	}, func() string {
		return fmt.Sprintf("the reservation (taken: %v) expires at %s, first seen expiring at %s: not extended", acquired, expires, first)
	})

	stop()
	eventually.True(t, 30*time.Second, func() bool {
		acquired, expires = take()
		return acquired
	}, func() string {
		return fmt.Sprintf("the stopped executor's reservation is still extended (it expires at %s): its heartbeats outlived the manager", expires)
	})
}
