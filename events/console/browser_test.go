package console_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/flytekube/backend/test/chromium"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/repo"
)

// The browser tests drive Debian's Chromium, headless, through the DevTools protocol
// (chromedp): one browser for the package, a tab for each test. `.ci/run` installs
// chromium; a test without it fails when it could have been installed (as root) and is
// skipped, saying why, otherwise.

var (
	pg *pgtest.Server
	// browser is the context of the package's browser; tabs are opened from it.
	browser context.Context
	// noBrowser says why there is no browser, failing every browser test.
	noBrowser string

	screenshots = flag.Bool("screenshots", false, "write the pages' screenshots to docs/console, for docs/console.md")
)

func TestMain(m *testing.M) {
	flag.Parse()
	stop := startBrowser()
	code := pgtest.Main(m, &pg)
	stop()
	os.Exit(code)
}

// startBrowser starts the package's browser (test/chromium), or says in noBrowser
// why there is none.
func startBrowser() (stop func()) {
	ctx, stop, err := chromium.Start()
	if err != nil {
		noBrowser = err.Error()
		return func() {}
	}
	browser = ctx
	return stop
}

// tab is a new tab of the package's browser, closed when the test ends. It fails the
// test for every script error the page throws, every message the browser logs as an
// error (a refused Content-Security-Policy among them) and every request to another
// host than 127.0.0.1.
func tab(t *testing.T) context.Context {
	t.Helper()
	if browser == nil {
		t.Fatal(noBrowser) // make test installs chromium
	}
	ctx, cancel := chromedp.NewContext(browser)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	messages := chromedp.Console(ctx)
	requests := chromedp.Events(ctx, network.RequestWillBeSent)
	var mu sync.Mutex
	var problems []string
	problem := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		problems = append(problems, s)
	}
	wg.Go(func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() || (m.Type == chromedp.ConsoleError && !expectedError(m.Text)) {
				problem(fmt.Sprintf("the page logged %s (%s:%d)", m, m.URL, m.Line))
			}
		}
	})
	wg.Go(func() {
		for ev, err := range requests {
			if err != nil {
				return
			}
			if u, err := url.Parse(ev.Request.URL); err != nil || (u.Scheme != "data" && u.Hostname() != "127.0.0.1") {
				problem("the browser asked for " + ev.Request.URL)
			}
		}
	})
	t.Cleanup(func() {
		cancelTimeout()
		cancel()
		wg.Wait()
		for _, p := range problems {
			t.Error(p)
		}
	})
	return ctx
}

// expectedError reports whether the browser's error message is one a test brings about
// on purpose: the service refusing a bad token logs the 401 of the refused call.
func expectedError(text string) bool {
	return strings.Contains(text, "status of 401") || strings.Contains(text, "status of 403")
}

// do runs steps in the tab, failing the test with what the page shows if one fails.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		t.Fatalf("%v\nthe page shows:\n%s", err, text)
	}
}

// waitFor waits until the JavaScript expression is true, across reloads of the page
// (an expression evaluated while a page is replaced fails, and is asked again).
func waitFor(t *testing.T, ctx context.Context, expression string) {
	t.Helper()
	var last error
	eventually.True(t, 20*time.Second, func() bool {
		var ok bool
		ok, last = chromedp.Run(ctx, chromedp.Evaluate[bool](expression))
		return ok
	}, func() string {
		text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		return fmt.Sprintf("waiting for %s (last error: %v); the page shows:\n%s", expression, last, text)
	})
}

func eval[T any](t *testing.T, ctx context.Context, expression string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expression))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expression, err)
	}
	return v
}

// screenshot keeps a picture of the page: in docs/console with -screenshots, else in
// the test's artifact directory (kept with go test -artifacts).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := t.ArtifactDir()
	if *screenshots {
		if dir, err = repo.Path("docs", "console"); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// listen listens on a port of the loopback for the console.
func listen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}
