package executor_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/eventually"
)

// listRecorder notes how the executor's informers fill: a LIST of a collection, or a
// watch that streams its first state (sendInitialEvents), by resource.
type listRecorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []string
}

func (l *listRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	// A collection: .../namespaces/<ns>/<resource> or a cluster-wide .../<resource>.
	if r.Method == http.MethodGet && len(parts) >= 3 && (parts[len(parts)-3] == "namespaces" || !slices.Contains(parts, "namespaces")) {
		q := r.URL.Query()
		how := "list"
		switch {
		case q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true":
			how = "streamed"
		case q.Get("watch") == "true":
			how = "watch"
		}
		l.mu.Lock()
		l.seen = append(l.seen, how+" "+parts[len(parts)-1])
		l.mu.Unlock()
	}
	return l.next.RoundTrip(r)
}

// TestInformersStreamTheirFirstList: the executor's informers get their first state as
// a watch stream, item by item, not as one LIST that the API server must build in
// memory whole (and the executor decode whole), for a store of 500,000 actions a
// spike of gigabytes on both sides.
func TestInformersStreamTheirFirstList(t *testing.T) {
	ns := env.Namespace(t)
	// Something of each kind to list: actions, and the pod of a container action.
	createActions(t, 3, func(i int) *flytev1.TaskAction { return containerAction(ns, fmt.Sprintf("a%d", i), 0) })
	rec := &listRecorder{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { rec.next = rt; return rec }
	start(t, testConfig(), ns, runOptions{restConfig: cfg})

	seen := func() []string {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return slices.Clone(rec.seen)
	}
	resources := []string{"taskactions", "pods", "jobs"}
	// The informers of the kinds plugins create start with the controller.
	eventually.True(t, 30*time.Second, func() bool {
		s := seen()
		for _, resource := range resources {
			if !slices.Contains(s, "streamed "+resource) && !slices.Contains(s, "list "+resource) {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("not every informer started; collection requests: %v", seen()) })
	for _, resource := range resources {
		if s := seen(); slices.Contains(s, "list "+resource) || !slices.Contains(s, "streamed "+resource) {
			t.Errorf("the %s informer listed its collection instead of streaming it; collection requests: %v", resource, s)
		}
	}
}
