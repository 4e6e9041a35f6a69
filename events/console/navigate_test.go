package console_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Going from page to page in one tab, as a person does, never runs out of the browser's
// connections to the console (plain HTTP/1.1: six per origin), although each page keeps
// a stream open: a page's streams end when it is left, even for the back-forward cache,
// and a page brought back from that cache is live again.
func TestManyPagesInOneTab(t *testing.T) {
	s := startService(t)
	sample(t, s, time.Now().Add(-5*time.Minute).Truncate(time.Second))
	ctx := tab(t)
	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development", s.tokens.Viewer)))
	waitFor(t, ctx, `document.querySelectorAll("#runs tbody tr").length > 0`)
	for i := range 10 {
		do(t, ctx, chromedp.Navigate(s.page(fmt.Sprintf("project=demo&domain=development&run=nightly-etl&page=%d", i), "")))
		waitFor(t, ctx, `document.querySelectorAll("#actions tbody tr").length > 0 && document.getElementById("live").textContent === "live"`)
	}
	for range 3 {
		do(t, ctx, chromedp.NavigateBack())
		waitFor(t, ctx, `document.querySelectorAll("#actions tbody tr").length > 0 && document.getElementById("live").textContent === "live"`)
	}
}
