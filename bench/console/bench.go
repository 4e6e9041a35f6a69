// Package consolebench measures how fast the events service's web console loads in a real
// browser (Debian's Chromium, headless, test/chromium), against a baseline taken in
// the same run, because absolute figures on a shared machine mean little.
//
// For each view (the runs of a project and domain, one run, one action) every sample
// opens the view in a tab of a browser context of its own, with the cache disabled, so
// that each load fetches everything, and measures, by the page's own clock, the time
// from the start of the navigation until the DOM holds what the view must show. The
// baseline is the same browser loading, the same way, one static HTML page of as many
// bytes as the console's view transferred: that view's DOM as the console drew it, its
// style sheet inline, no script, served by a plain net/http server on the loopback. The
// ratio says what the console costs above the browser fetching and drawing a page.
package consolebench

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/events/store"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/auth/devcreds"
	"github.com/flytekube/backend/test/chromium"
)

// Options size the run.
type Options struct {
	DatabaseURL string
	// Samples is the number of loads of each view, and of each view's baseline.
	Samples int
	// Runs and ActionsPerRun size what is recorded (see history).
	Runs, ActionsPerRun int
}

// Validate reports what the options cannot measure.
func (o Options) Validate() error {
	switch {
	case o.Samples < 1:
		return fmt.Errorf("samples: at least 1, got %d", o.Samples)
	case o.Runs < 2:
		return fmt.Errorf("runs: at least 2 (the run shown is a finished one), got %d", o.Runs)
	case o.ActionsPerRun < 11:
		return fmt.Errorf("actions: at least 11 per run (the action shown is the eleventh), got %d", o.ActionsPerRun)
	}
	return nil
}

// view is one of the console's views and what it must show.
type view struct {
	name, query string
	// what says what shown waits for, for the report.
	what string
	// shown is a JavaScript expression true once the view shows it.
	shown string
}

func views(h *history) []view {
	// A finished run, one in ten of whose retried actions failed; its eleventh action
	// was retried after an OOMKilled error and has cluster events.
	i := (h.runs - 2) / 10 * 10
	run, action := runName(i), actionName(10)
	evs := h.eventsOf[run+"/"+action]
	scope := "project=" + project + "&domain=" + domain
	return []view{
		{"runs", scope, fmt.Sprintf("the %d runs listed", h.runs),
			fmt.Sprintf(`document.querySelectorAll("#runs tbody tr").length === %d`, h.runs)},
		{"run", scope + "&run=" + run, fmt.Sprintf("its %d actions listed", h.actionsPerRun),
			fmt.Sprintf(`document.querySelectorAll("#actions tbody tr").length === %d`, h.actionsPerRun)},
		{"action", scope + "&run=" + run + "&action=" + action, fmt.Sprintf("its timeline drawn and its %d events listed", evs),
			fmt.Sprintf(`document.querySelectorAll("#timeline g.bar").length > 0 && document.querySelectorAll("#events tbody tr").length === %d`, evs)},
	}
}

// Result is one view's samples.
type Result struct {
	View, Query, What string
	// Console and Baseline are the loads of the view and of its baseline, in the order
	// they ran.
	Console, Baseline []Load
}

// Run records a history, then loads each view and its baseline o.Samples times,
// alternating which goes first, and writes a Markdown report to w.
func Run(ctx context.Context, o Options, w io.Writer, progress io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	svc, err := startService(ctx, o.DatabaseURL)
	if err != nil {
		return err
	}
	defer func() { _ = svc.stop() }()

	h := newHistory(o.Runs, o.ActionsPerRun, time.Now())
	fmt.Fprintf(progress, "recording %d runs of %d actions (%d events)\n", o.Runs, o.ActionsPerRun, len(h.events))
	if err := svc.record(ctx, h.events); err != nil {
		return err
	}

	browser, stopBrowser, err := chromium.Start()
	if err != nil {
		return err
	}
	defer stopBrowser()
	static, err := startStaticServer()
	if err != nil {
		return err
	}
	defer func() { _ = static.stop() }()

	vs := views(h)
	results := make([]Result, len(vs))
	type target struct{ console, baseline string }
	targets := make([]target, len(vs))
	for k, v := range vs {
		// The first load warms the service (its queries, the page's first compile)
		// and draws the page the baseline copies; it is not counted.
		page := svc.console + "?" + v.query + "#token=" + svc.viewerToken
		first, err := load(browser, page, v.shown, true)
		if err != nil {
			return fmt.Errorf("%s view: %w", v.name, err)
		}
		base := static.put("/"+v.name, first.static)
		if _, err := load(browser, base, v.shown, false); err != nil {
			return fmt.Errorf("%s view's baseline: %w", v.name, err)
		}
		targets[k] = target{page, base}
		results[k] = Result{View: v.name, Query: v.query, What: v.what}
	}
	fmt.Fprintf(progress, "loading %d views and their baselines, %d samples each\n", len(vs), o.Samples)
	for i := range o.Samples {
		for k, v := range vs {
			order := []string{targets[k].console, targets[k].baseline}
			if (i+k)%2 == 1 {
				order[0], order[1] = order[1], order[0]
			}
			for _, u := range order {
				l, err := load(browser, u, v.shown, false)
				if err != nil {
					return fmt.Errorf("%s view, sample %d: %w", v.name, i+1, err)
				}
				if u == targets[k].console {
					results[k].Console = append(results[k].Console, l)
				} else {
					results[k].Baseline = append(results[k].Baseline, l)
				}
			}
		}
		if (i+1)%10 == 0 || i+1 == o.Samples {
			fmt.Fprintf(progress, "%d of %d samples\n", i+1, o.Samples)
		}
	}
	Write(w, o, len(h.events), results)
	return nil
}

// service is the events service with its console, run in-process as its binary runs
// it, in auth mode token-file with the tokens `make run` makes (services/auth/devcreds).
type service struct {
	console     string
	viewerToken string
	executor    eventsv1connect.EventsServiceClient
	stop        func() error
}

func startService(ctx context.Context, databaseURL string) (*service, error) {
	// A database given by URL may hold earlier runs, which the views would list.
	pool, err := benchutil.OpenMigrated(ctx, databaseURL, store.Migrations())
	if err != nil {
		return nil, err
	}
	_, err = pool.Exec(ctx, "TRUNCATE action_events, actions")
	pool.Close()
	if err != nil {
		return nil, fmt.Errorf("emptying the store: %w", err)
	}
	dir, err := os.MkdirTemp("", "console-bench-")
	if err != nil {
		return nil, err
	}
	creds, err := devcreds.Ensure(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("console listener: %w", err)
	}
	cfg := events.Config{
		Listen: "127.0.0.1:0", DatabaseURL: databaseURL,
		Auth:            auth.Config{Mode: auth.ModeTokenFile, TokenFile: creds.TokensFile},
		ConsoleListener: lis,
	}
	url, stop, err := benchutil.StartService(ctx, events.Run, cfg)
	if err != nil {
		_ = lis.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &service{
		console:     "http://" + lis.Addr().String() + "/console/",
		viewerToken: creds.ViewerToken,
		executor:    eventsv1connect.NewEventsServiceClient(benchutil.Clients(1, creds.ExecutorToken)[0], url),
		// The service rereads its token file while it runs.
		stop: func() error { err := stop(); _ = os.RemoveAll(dir); return err },
	}, nil
}

// record sends the events as the executor does, in batches.
func (s *service) record(ctx context.Context, evs []*eventsv1.ActionEvent) error {
	for len(evs) > 0 {
		n := min(500, len(evs))
		if _, err := s.executor.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: evs[:n]})); err != nil {
			return fmt.Errorf("record: %w", err)
		}
		evs = evs[n:]
	}
	return nil
}

// Write writes the report.
func Write(w io.Writer, o Options, events int, results []Result) {
	fmt.Fprintf(w, "### Web console: %d runs of %d actions (%d events), %d samples per view\n\n", o.Runs, o.ActionsPerRun, events, o.Samples)
	fmt.Fprintln(w, "Time from the start of the navigation until the view shows what it must, by the page's clock; each load in a")
	fmt.Fprintln(w, "browser context of its own with the cache disabled. Baseline: a static page of as many bytes (the view's DOM")
	fmt.Fprintln(w, "as drawn, its style sheet inline, no script) from a plain net/http server.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| view | shown when | console: median | p95 | baseline: median | p95 | console / baseline: median | p95 | transferred: console | baseline |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range results {
		c, b := times(r.Console, shown), times(r.Baseline, shown)
		cm, cp, bm, bp := benchutil.Percentile(c, 0.5), benchutil.Percentile(c, 0.95), benchutil.Percentile(b, 0.5), benchutil.Percentile(b, 0.95)
		fmt.Fprintf(w, "| %s (`?%s`) | %s | %s | %s | %s | %s | %.1f | %.1f | %s | %s |\n", r.View, r.Query, r.What,
			ms(cm), ms(cp), ms(bm), ms(bp), ratio(cm, bm), ratio(cp, bp),
			kB(medianBytes(r.Console, Load.Transferred)), kB(medianBytes(r.Baseline, Load.Transferred)))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Where the console's time goes, medians on the same clock: its HTML received, parsed and its script run")
	fmt.Fprintln(w, "(DOMContentLoaded), the last answer of the service that the view waited for received, the view shown.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| view | HTML received | script run | last answer received | shown |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
	for _, r := range results {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", r.View, ms(median(r.Console, func(l Load) time.Duration { return l.Document })),
			ms(median(r.Console, func(l Load) time.Duration { return l.Ready })),
			ms(median(r.Console, func(l Load) time.Duration { return l.Data })), ms(median(r.Console, shown)))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "What each view of the console fetched (its first sample): bytes transferred (encodedDataLength, headers")
	fmt.Fprintln(w, "included, as compressed as they came) / body as decoded; a stream still open when the view was shown counts")
	fmt.Fprintln(w, "what it had received.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| view | requests | transferred | decoded bodies | each |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | --- |")
	for _, r := range results {
		first := r.Console[0]
		var each []string
		for _, q := range first.Requests {
			open := ""
			if q.Open {
				open = ", open"
			}
			each = append(each, fmt.Sprintf("%s %s / %s%s", q.Name, kB(q.Transferred), kB(q.Body), open))
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s |\n", r.View, len(first.Requests), kB(first.Transferred()), kB(first.Body()), strings.Join(each, "; "))
	}
}

func times(ls []Load, of func(Load) time.Duration) []time.Duration {
	out := make([]time.Duration, len(ls))
	for i, l := range ls {
		out[i] = of(l)
	}
	return out
}

func shown(l Load) time.Duration { return l.Shown }

func median(ls []Load, of func(Load) time.Duration) time.Duration {
	return benchutil.Percentile(times(ls, of), 0.5)
}

func medianBytes(ls []Load, bytes func(Load) int64) int64 {
	xs := make([]float64, len(ls))
	for i, l := range ls {
		xs[i] = float64(bytes(l))
	}
	return int64(benchutil.Median(xs))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func kB(n int64) string { return fmt.Sprintf("%.1f kB", float64(n)/1000) }
