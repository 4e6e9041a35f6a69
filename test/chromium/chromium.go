// Package chromium starts Debian's Chromium, headless, driven through the DevTools
// protocol (chromedp), kept on the loopback: the console's browser tests and its bench
// share it.
package chromium

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"

	"github.com/chromedp/chromedp"
)

// ErrNotInstalled is returned by Start when there is no chromium on the PATH.
var ErrNotInstalled = errors.New("chromium is not installed (Debian's chromium package; make test installs it as root)")

// Flags keep the browser on the loopback: no background requests, component updates,
// sync, DNS prefetching or proxy, and every host name but 127.0.0.1 resolves to nothing.
// The language, time zone and window size are fixed so that pages render alike
// everywhere.
func Flags() []chromedp.ExecAllocatorOption {
	return append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-domain-reliability", true),
		chromedp.Flag("dns-prefetch-disable", true),
		chromedp.Flag("no-pings", true),
		chromedp.Flag("no-proxy-server", true),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.Flag("disable-features", "Translate,BlinkGenPropertyTrees,OptimizationHints,MediaRouter,AutofillServerCommunication,CertificateTransparencyComponentUpdater"),
		chromedp.Flag("lang", "en-GB"),
		chromedp.Env("TZ=UTC", "LANG=en_GB.UTF-8"),
		chromedp.WindowSize(1280, 900),
	)
}

// Start starts chromium with Flags and returns the browser's context: each
// chromedp.NewContext made from it is a tab of that browser. stop ends the browser.
func Start() (browser context.Context, stop func(), err error) {
	path, err := exec.LookPath("chromium")
	if err != nil {
		return nil, nil, ErrNotInstalled
	}
	opts := append(Flags(), chromedp.ExecPath(path))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium's sandbox refuses to run as root
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	// The first action starts the browser, which lives as long as ctx.
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		cancelAlloc()
		return nil, nil, fmt.Errorf("starting %s: %w", path, err)
	}
	return ctx, func() { cancel(); cancelAlloc() }, nil
}
