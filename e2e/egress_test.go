package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"google.golang.org/protobuf/types/known/timestamppb"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/ports"
	"github.com/flytekube/backend/test/repo"
	"github.com/flytekube/backend/test/servicetest"
)

// TestEventsServiceKilledMidPublish: the events binary is killed (SIGKILL) while a sink
// holds its request for an event; started again, it sends that event again, with the
// same CloudEvent id, and then everything else: at least once, in order, nothing lost.
func TestEventsServiceKilledMidPublish(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "events")
	build := exec.Command("go", "build", "-o", bin, "./events/cmd/events")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the events service: %v\n%s", err, out)
	}

	var (
		mu       sync.Mutex
		seen     []string // ids of every request, answered or not
		accepted []string // ids acknowledged, in order
	)
	held := make(chan struct{})
	release := make(chan struct{})
	var holdOnce sync.Once
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e, err := cehttp.NewEventFromHTTPRequest(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		seen = append(seen, e.ID())
		first := len(seen) == 1
		mu.Unlock()
		if first {
			holdOnce.Do(func() { close(held) })
			<-release // the service is killed meanwhile
			http.Error(w, "too late", http.StatusServiceUnavailable)
			return
		}
		mu.Lock()
		accepted = append(accepted, e.ID())
		mu.Unlock()
	}))
	t.Cleanup(receiver.Close)

	pg := pgtest.New(t)
	dbURL := pg.NewDatabase(t)
	p, err := ports.Free(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(p[0])
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "--listen", addr, "--metrics-listen", "", "--database-url", dbURL, "--auth-mode", "none",
			"--cloudevents-sink", receiver.URL+"?name=receiver")
		out := &servicetest.SyncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("events service:\n%s", out.String())
			}
		})
		eventually.True(t, 30*time.Second, func() bool {
			resp, err := http.Get("http://" + addr + "/healthz")
			if err == nil {
				_ = resp.Body.Close()
			}
			return err == nil && resp.StatusCode == http.StatusOK
		}, func() string { return "the events service never answered" })
		return cmd
	}
	first := start()

	client := eventsv1connect.NewEventsServiceClient(servicetest.H2CClient(), "http://"+addr, connect.WithGRPC())
	var want []string
	for a := range 3 {
		var evs []*eventsv1.ActionEvent
		for v, ph := range []flytecorev1.ActionPhase{flytecorev1.ActionPhase_ACTION_PHASE_QUEUED, flytecorev1.ActionPhase_ACTION_PHASE_RUNNING, flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED} {
			evs = append(evs, &eventsv1.ActionEvent{
				Id:      &flytecorev1.ActionIdentifier{Project: "demo", Domain: "development", Run: "killed", Action: fmt.Sprintf("a%d", a)},
				Attempt: 1, Phase: ph, Version: uint32(v), OccurredAt: timestamppb.Now(), TaskType: "container",
			})
		}
		if _, err := client.Record(context.Background(), connect.NewRequest(&eventsv1.RecordRequest{Events: evs})); err != nil {
			t.Fatal(err)
		}
		for v, ph := range []string{"queued", "running", "succeeded"} {
			want = append(want, fmt.Sprintf("demo/development/killed/a%d/1/%s/%d", a, ph, v))
		}
	}
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never published")
	}
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	close(release)

	start()
	eventually.True(t, 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(accepted) >= len(want)
	}, func() string {
		return fmt.Sprintf("after the restart %d of %d events were acknowledged", len(accepted), len(want))
	})
	mu.Lock()
	defer mu.Unlock()
	if seen[0] != want[0] || accepted[0] != want[0] {
		t.Errorf("the event held when the service died was %s; the first acknowledged after the restart is %s; want both %s", seen[0], accepted[0], want[0])
	}
	// Records are published in the order they were recorded, each action's in order.
	if fmt.Sprint(accepted) != fmt.Sprint(want) {
		t.Errorf("acknowledged %v; want each event once, in order: %v", accepted, want)
	}
}
