package console_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/flytekube/backend/events"
)

// How often the durations are read, and how many times: each read after the first must
// show more than the one before (the pages move on once a second), and the last must
// have grown about as much as the time between the first and the last.
const (
	tickReadEvery = 1500 * time.Millisecond
	tickReads     = 3
	// tickSlack is what a shown duration may lag (up to a second since the last tick)
	// and round (to a tenth below 10 s, to a second above) at either end of the span.
	tickSlack = 1200 * time.Millisecond
)

// A running action's durations grow on the open page between events, without the page
// being drawn again, and a finished action's stay as they are.
func TestDurationsOfWhatRunsMoveOnBetweenEvents(t *testing.T) {
	// A Jaeger with no traces, so that the action page's trace lookup finds none
	// instead of being refused (which the browser logs as an error).
	jaeger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"data":[]}`))
	}))
	t.Cleanup(jaeger.Close)
	s := startService(t, func(c *events.Config) { c.JaegerQueryURL = jaeger.URL })
	finished := time.Now().Add(-time.Minute).Truncate(time.Second)
	s.record(t, timeline(finished, id("ticking", "done"),
		step{1, queued, 0, "Queued", nil},
		step{1, running, 2, "Running", nil},
		step{1, succeeded, 5, "Succeeded", nil},
	)...)
	// Started just now, so that its durations are shown to a tenth of a second.
	s.record(t, timeline(time.Now().Add(-time.Second), id("ticking", "busy"),
		step{1, queued, 0, "Queued", nil},
		step{1, running, 0, "Running", nil},
	)...)
	ctx := tab(t)

	// The run page: the running action's duration grows, in the same row; the finished
	// action's does not change.
	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development&run=ticking", s.tokens.Viewer)))
	waitFor(t, ctx, `document.querySelectorAll("#actions tbody tr").length === 2`)
	eval[bool](t, ctx, `(window.busyRow = document.querySelector('#actions tr[data-action="busy"]')) !== null`)
	durationCell := func(action string) string {
		return fmt.Sprintf(`document.querySelector('#actions tr[data-action=%q] td:nth-child(5)').innerText`, action)
	}
	busy := readTicking(t, func() time.Duration { return shownDuration(t, eval[string](t, ctx, durationCell("busy"))) })
	busy[0].mustGrow(t, "the running action's duration on the run page")
	if done := eval[string](t, ctx, durationCell("done")); done != "5.0 s" {
		t.Errorf("the finished action's duration on the run page: got %q, want 5.0 s", done)
	}
	if !eval[bool](t, ctx, `window.busyRow.isConnected`) {
		t.Error("the run page drew the running action's row again to move its duration on")
	}

	// The action page: the running phase's bar ends now, later at every read, and how
	// long the action has been running grows; the timeline is the same drawing.
	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development&run=ticking&action=busy", "")))
	waitFor(t, ctx, `document.querySelector("#timeline g.bar.open") !== null`)
	eval[bool](t, ctx, `(window.timeline = document.getElementById("timeline")) !== null`)
	action := readTicking(t,
		func() time.Duration {
			return time.Duration(eval[float64](t, ctx, `Number(document.querySelector("#timeline g.bar.open").dataset.end)`)) * time.Millisecond
		},
		func() time.Duration {
			return shownDuration(t, eval[string](t, ctx, `document.querySelector('[data-fact="running for"]').innerText`))
		},
	)
	action[0].mustGrow(t, "the end of the running phase's bar")
	action[1].mustGrow(t, `the action page's "running for"`)
	if widths := eval[[]float64](t, ctx, `[...document.querySelectorAll("#timeline g.bar rect")].map(r => r.width.baseVal.value)`); len(widths) != 2 || widths[1] <= widths[0] {
		t.Errorf("bar widths %v: the running phase (seconds long) must be wider than the instant queued before it", widths)
	}
	if !eval[bool](t, ctx, `window.timeline.isConnected`) {
		t.Error("the action page drew its timeline again to move the running phase on")
	}

	// The finished action's page stays as it is.
	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development&run=ticking&action=done", "")))
	waitFor(t, ctx, `document.querySelectorAll("#timeline g.bar").length === 3`)
	const drawn = `JSON.stringify([[...document.querySelectorAll("#timeline g.bar")].map(b => [b.dataset.end, b.querySelector("rect").getAttribute("width")]), document.querySelector('[data-fact="took"]').innerText])`
	before := eval[string](t, ctx, drawn)
	time.Sleep(2 * time.Second)
	if after := eval[string](t, ctx, drawn); after != before {
		t.Errorf("the finished action's page changed with no event: %s, then %s", before, after)
	}
	if !strings.Contains(before, `"5.0 s"`) {
		t.Errorf("the finished action's page: %s, want it to have taken 5.0 s", before)
	}
}

// ticking is a duration read on the page several times, and when.
type ticking struct {
	values []time.Duration
	at     []time.Time
}

// readTicking reads each duration tickReads times, tickReadEvery apart.
func readTicking(t *testing.T, reads ...func() time.Duration) []ticking {
	t.Helper()
	out := make([]ticking, len(reads))
	for i := range tickReads {
		if i > 0 {
			time.Sleep(tickReadEvery)
		}
		for j, read := range reads {
			out[j].at = append(out[j].at, time.Now())
			out[j].values = append(out[j].values, read())
		}
	}
	return out
}

func (r ticking) mustGrow(t *testing.T, what string) {
	t.Helper()
	for i := 1; i < len(r.values); i++ {
		if r.values[i] <= r.values[i-1] {
			t.Errorf("%s did not grow in %v without events: read %v", what, r.at[i].Sub(r.at[i-1]).Round(time.Millisecond), r.values)
			return
		}
	}
	grew, took := r.values[len(r.values)-1]-r.values[0], r.at[len(r.at)-1].Sub(r.at[0])
	t.Logf("%s: read %v, grew by %v in %v", what, r.values, grew, took.Round(time.Millisecond))
	if grew < took-tickSlack || grew > took+tickSlack {
		t.Errorf("%s grew by %v in %v: read %v", what, grew, took.Round(time.Millisecond), r.values)
	}
}

// shownDuration reads a duration as the console shows it ("850 ms", "2.5 s", "42 s",
// "3 m 07 s", "1 h 05 m").
func shownDuration(t *testing.T, text string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(strings.ReplaceAll(strings.TrimSpace(text), " ", ""))
	if err != nil {
		t.Fatalf("reading the shown duration %q: %v", text, err)
	}
	return d
}
