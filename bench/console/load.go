package consolebench

import (
	"context"
	"fmt"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// loadTimeout bounds one page load, from opening its tab to its transfers settling.
const loadTimeout = time.Minute

// Load is what one page load measured.
type Load struct {
	// Shown is the time from the start of the navigation until the page's DOM held what
	// the view must show (its shown condition), by the page's own clock.
	Shown time.Duration
	// Document is when the page's HTML had arrived, Ready when it had been parsed and
	// its scripts run (DOMContentLoaded), and Data when the last of the service's
	// answers to finish before the view was shown had arrived (0 when there was none):
	// on the same clock as Shown.
	Document, Ready, Data time.Duration
	// Requests are the page's requests, in the order they were sent.
	Requests []Request
	// static is the page as drawn, made static (snapshot only).
	static []byte
}

// Request is one request of a page load.
type Request struct {
	// Name is the URL's last path element.
	Name string
	// Transferred is what the browser read off the network for it (encodedDataLength:
	// headers and body, as compressed as the server sent it); Body is the body as
	// decoded.
	Transferred, Body int64
	// Open is set for a stream still open when the page was measured; its figures are
	// what it had received by then.
	Open bool
}

// Transferred totals the requests' transferred bytes.
func (l Load) Transferred() int64 {
	var n int64
	for _, r := range l.Requests {
		n += r.Transferred
	}
	return n
}

// Body totals the requests' decoded bodies.
func (l Load) Body() int64 {
	var n int64
	for _, r := range l.Requests {
		n += r.Body
	}
	return n
}

// shownWatcher is run by the browser in each new document before any of the page's own
// scripts: it watches the DOM from the start of parsing, and the moment shown (a
// JavaScript expression) is true it marks the time, as performance.now(): milliseconds
// from the start of the navigation.
func shownWatcher(shown string) string {
	return `(() => {
  const shown = () => (` + shown + `);
  let resolve;
  window.__consoleBench = { shown: new Promise((r) => (resolve = r)) };
  const observer = new MutationObserver(() => {
    if (!shown()) return;
    observer.disconnect();
    performance.mark("shown");
    resolve(performance.now());
  });
  observer.observe(document, { childList: true, subtree: true, characterData: true });
})();`
}

// load opens url in a tab of a browser context of its own (empty cache, cookies,
// storage and connections), with the cache disabled, and measures it; with snapshot it
// also keeps the page as drawn, made static (staticPage).
func load(browser context.Context, pageURL, shown string, snapshot bool) (Load, error) {
	tab, closeTab := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	defer closeTab()
	if err := chromedp.Do(tab); err != nil { // opens the tab, outside the timeout
		return Load{}, fmt.Errorf("opening a tab: %w", err)
	}
	ctx, cancel := context.WithTimeout(tab, loadTimeout)
	defer cancel()

	requests := newNetLog()
	if err := chromedp.Listen(ctx, requests.observe); err != nil {
		return Load{}, err
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		return Load{}, fmt.Errorf("network.enable: %w", err)
	}
	if _, err := chromedp.Call(ctx, network.SetCacheDisabled, network.SetCacheDisabledParams{CacheDisabled: true}); err != nil {
		return Load{}, fmt.Errorf("network.setCacheDisabled: %w", err)
	}
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: shownWatcher(shown)}); err != nil {
		return Load{}, fmt.Errorf("page.addScriptToEvaluateOnNewDocument: %w", err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(pageURL)); err != nil {
		return Load{}, fmt.Errorf("loading %s: %w", redact(pageURL), err)
	}
	ms, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`window.__consoleBench.shown`, chromedp.EvalAwaitPromise))
	if err != nil {
		text, _ := chromedp.Run(tab, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		return Load{}, fmt.Errorf("waiting for %s on %s: %w; the page shows:\n%s", shown, redact(pageURL), err, text)
	}
	type timing struct{ Document, Ready, Data float64 }
	t, err := chromedp.Run(ctx, chromedp.Evaluate[timing](timingScript))
	if err != nil {
		return Load{}, fmt.Errorf("reading the timings of %s: %w", redact(pageURL), err)
	}
	l := Load{Shown: millis(ms), Document: millis(t.Document), Ready: millis(t.Ready), Data: millis(t.Data)}
	if l.Requests, err = requests.settled(ctx); err != nil {
		return Load{}, fmt.Errorf("%s: %w", redact(pageURL), err)
	}
	if snapshot {
		dom, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
		if err != nil {
			return Load{}, err
		}
		css, err := chromedp.Run(ctx, chromedp.Evaluate[string](`[...document.styleSheets].flatMap((s) => [...s.cssRules].map((r) => r.cssText)).join("\n")`))
		if err != nil {
			return Load{}, err
		}
		l.static = staticPage(dom, css, l.Transferred())
	}
	return l, nil
}

// timingScript reads the navigation's and the service's answers' timings (Load).
const timingScript = `(() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const shown = performance.getEntriesByName("shown")[0].startTime;
  const answers = performance.getEntriesByType("resource").filter((r) => r.name.includes("/console/api/") && r.responseEnd <= shown);
  return { Document: nav.responseEnd, Ready: nav.domContentLoadedEventEnd, Data: Math.max(0, ...answers.map((r) => r.responseEnd)) };
})()`

func millis(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// redact keeps a token out of error messages.
func redact(u string) string {
	if i := strings.Index(u, "#"); i >= 0 {
		return u[:i] + "#…"
	}
	return u
}

// netLog follows a tab's requests from its Network events.
type netLog struct {
	mu       sync.Mutex
	order    []network.RequestID
	requests map[network.RequestID]*loggedRequest
	// offLoopback is the first URL asked for elsewhere than 127.0.0.1.
	offLoopback string
}

type loggedRequest struct {
	url                string
	stream, done       bool
	failed             string
	finished, received int64 // encodedDataLength at loadingFinished; of the chunks so far
	headers, body      int64
}

func newNetLog() *netLog { return &netLog{requests: map[network.RequestID]*loggedRequest{}} }

// observe runs on the tab's reader goroutine: it only records.
func (n *netLog) observe(ev any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		if _, ok := n.requests[ev.RequestID]; !ok {
			n.order = append(n.order, ev.RequestID)
			n.requests[ev.RequestID] = &loggedRequest{}
		}
		r := n.requests[ev.RequestID]
		r.url = ev.Request.URL
		if u, err := url.Parse(r.url); n.offLoopback == "" && (err != nil || (u.Scheme != "data" && u.Hostname() != "127.0.0.1")) {
			n.offLoopback = r.url
		}
	case *network.EventResponseReceived:
		if r := n.requests[ev.RequestID]; r != nil && ev.Response != nil {
			// Connect's server streams (WatchActions) stay open for as long as the page.
			r.stream = strings.HasPrefix(ev.Response.MimeType, "application/connect+")
			r.headers = int64(ev.Response.EncodedDataLength)
		}
	case *network.EventDataReceived:
		if r := n.requests[ev.RequestID]; r != nil {
			r.received += ev.EncodedDataLength
			r.body += ev.DataLength
		}
	case *network.EventLoadingFinished:
		if r := n.requests[ev.RequestID]; r != nil {
			r.done, r.finished = true, int64(ev.EncodedDataLength)
		}
	case *network.EventLoadingFailed:
		if r := n.requests[ev.RequestID]; r != nil {
			r.done, r.failed = true, ev.ErrorText
		}
	}
}

// settled waits until every request but the open streams has finished, and returns
// them all.
func (n *netLog) settled(ctx context.Context) ([]Request, error) {
	for {
		n.mu.Lock()
		if n.offLoopback != "" {
			n.mu.Unlock()
			return nil, fmt.Errorf("the browser asked for %s, off the loopback", n.offLoopback)
		}
		pending := ""
		var out []Request
		for _, id := range n.order {
			r := n.requests[id]
			u, _ := url.Parse(r.url)
			name := r.url
			if u != nil {
				name = path.Base(u.Path)
			}
			switch {
			case r.failed != "" && r.failed != "net::ERR_ABORTED":
				n.mu.Unlock()
				return nil, fmt.Errorf("%s failed: %s", r.url, r.failed)
			case r.done:
				out = append(out, Request{Name: name, Transferred: r.finished, Body: r.body})
			case r.stream:
				out = append(out, Request{Name: name, Transferred: r.headers + r.received, Body: r.body, Open: true})
			default:
				pending = r.url
			}
		}
		n.mu.Unlock()
		if pending == "" {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s to finish: %w", pending, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
