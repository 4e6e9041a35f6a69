package console_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/flytekube/backend/events"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// TestActionsOfSeveralClusters: two clusters ran actions of one run, one of them under
// the same name in both (an action is its name and its cluster). The run shows each action once per cluster, with a
// cluster column and a filter whose links are deep links; each action's link opens
// that cluster's action.
func TestActionsOfSeveralClusters(t *testing.T) {
	// A Jaeger with no traces, as in TestDurationsOfWhatRunsMoveOnBetweenEvents.
	jaeger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"data":[]}`))
	}))
	t.Cleanup(jaeger.Close)
	s := startService(t, func(c *events.Config) { c.JaegerQueryURL = jaeger.URL })
	start := time.Now().Add(-5 * time.Minute).Truncate(time.Second)
	in := func(cluster string, evs []*eventsv1.ActionEvent) []*eventsv1.ActionEvent {
		for _, e := range evs {
			e.Cluster = cluster
		}
		return evs
	}
	s.record(t, in("east", timeline(start, id("nightly-etl", "extract"), step{1, queued, 0, "Queued", nil}, step{1, succeeded, 2, "Succeeded", nil}))...)
	s.record(t, in("west", timeline(start, id("nightly-etl", "extract"), step{1, queued, 0, "Queued", nil}, step{1, running, 3, "Running", nil}))...)
	s.record(t, in("west", timeline(start, id("nightly-etl", "load"), step{1, queued, 0, "Queued", nil}))...)
	ctx := tab(t)

	rows := `document.querySelectorAll("#actions tbody tr")`
	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development&run=nightly-etl", s.tokens.Viewer)))
	waitFor(t, ctx, rows+`.length === 3`)
	got := eval[[]string](t, ctx, `[...`+rows+`].map(r => r.dataset.action + " " + r.dataset.phase + " " + r.lastElementChild.innerText.trim())`)
	want := map[string]bool{"extract succeeded east": true, "extract running west": true, "load queued west": true}
	for _, g := range got {
		if !want[g] {
			t.Errorf("row %q; want the rows %v", g, want)
		}
	}

	// The filter's links are deep links to one cluster's actions.
	do(t, ctx, chromedp.Click(`#clusters a[href*="cluster=west"]`))
	waitFor(t, ctx, rows+`.length === 2 && location.search.includes("cluster=west")`)

	// Each action's link names its cluster, and opens that cluster's action.
	for _, c := range []struct{ cluster, phase string }{{"east", "Succeeded"}, {"west", "Running"}} {
		do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development&run=nightly-etl", "")))
		waitFor(t, ctx, rows+`.length === 3`)
		do(t, ctx, chromedp.Click(fmt.Sprintf(`#actions tr[data-action="extract"][data-cluster=%q] a`, c.cluster)))
		waitFor(t, ctx, fmt.Sprintf(`location.search.includes("cluster=%s") && document.querySelector("#action") !== null && document.querySelector("#action").innerText.includes(%q)`, c.cluster, c.phase))
	}
}
