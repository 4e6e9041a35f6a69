package consolebench

import (
	"strings"
	"testing"
	"time"

	"buf.build/go/protovalidate"

	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

func TestStaticPage(t *testing.T) {
	dom := `<html lang="en"><head><meta charset="utf-8"><link rel="stylesheet" href="console.css">` +
		`<script type="module" src="console.js"></script></head><body><table id="runs"><tbody><tr><td>r</td></tr></tbody></table></body></html>`
	for _, c := range []struct {
		name string
		size int64
		want int // page length
	}{
		{"padded to the size", 4000, 4000},
		{"larger than the size", 10, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			page := string(staticPage(dom, "td { color: red; }", c.size))
			if c.want >= 0 && len(page) != c.want {
				t.Errorf("page of %d bytes, want %d", len(page), c.want)
			}
			for _, gone := range []string{"<script", "<link", "console.js"} {
				if strings.Contains(page, gone) {
					t.Errorf("the page keeps %q:\n%s", gone, page)
				}
			}
			head, body, ok := strings.Cut(page, "</head>")
			if !ok || !strings.HasPrefix(page, "<!doctype html>") || !strings.Contains(head, "<style>\ntd { color: red; }\n</style>") {
				t.Errorf("want a doctype and the style sheet inline in the head:\n%.300s", page)
			}
			// The padding comes before what the page shows, so the browser has it all before it can draw.
			if !strings.Contains(body, `<table id="runs">`) || strings.Contains(body, "xxx") {
				t.Errorf("the padding must be in the head, the table in the body:\n%.300s", body)
			}
		})
	}
}

// The recorded history is what the service accepts, and what the views wait for is in
// it: the bench would otherwise find out only after starting Postgres and a browser.
func TestHistory(t *testing.T) {
	h := newHistory(50, 20, time.Now())
	for evs := h.events; len(evs) > 0; {
		n := min(500, len(evs))
		if err := protovalidate.Validate(&eventsv1.RecordRequest{Events: evs[:n]}); err != nil {
			t.Fatal(err)
		}
		evs = evs[n:]
	}
	total, runs := 0, map[string]bool{}
	for _, n := range h.eventsOf {
		total += n
	}
	for _, e := range h.events {
		runs[e.GetId().GetRun()] = true
	}
	if total != len(h.events) || len(runs) != 50 || len(h.eventsOf) != 50*20 {
		t.Errorf("%d events counted of %d, %d runs, %d actions: want 50 runs of 20 actions", total, len(h.events), len(runs), len(h.eventsOf))
	}
	// The action view shows a retried action with cluster events in a finished run.
	v := views(h)[2]
	run, action := "nightly-etl-040", "extract-10"
	if !strings.HasSuffix(v.query, "&run="+run+"&action="+action) {
		t.Fatalf("action view %q, want %s/%s", v.query, run, action)
	}
	attempts, clusterEvents, terminal := map[uint32]bool{}, 0, 0
	for _, e := range h.events {
		if e.GetId().GetRun() == run && e.GetId().GetAction() == action {
			attempts[e.GetAttempt()] = true
			clusterEvents += len(e.GetClusterEvents())
			if e.GetPhase() >= 5 {
				terminal++
			}
		}
	}
	if len(attempts) != 2 || clusterEvents == 0 || terminal != 1 {
		t.Errorf("%s/%s: %d attempts, %d cluster events, %d terminal events; want 2 attempts, cluster events, one end", run, action, len(attempts), clusterEvents, terminal)
	}
}
