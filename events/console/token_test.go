package console_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// A link carrying a token does not silently replace the token a tab holds: sent by
// someone else, it would sign the tab in as them. The page asks, shows nothing and asks
// the service nothing with the link's token until answered, and keeps the token held
// unless told to replace it.
func TestATokenLinkAsksBeforeReplacingTheTokenHeld(t *testing.T) {
	s := startService(t)
	sample(t, s, time.Now().Add(-5*time.Minute).Truncate(time.Second))
	ctx := tab(t)
	const runs = "project=demo&domain=development"
	const held = `sessionStorage.getItem("flyte-console-token")`
	const asked = `document.getElementById("token-confirm") !== null`
	const shown = `document.querySelectorAll("#runs tbody tr").length === 2`
	const refused = `document.querySelector("#notice .error")?.innerText.includes("may not read") === true`
	checkHeld := func(want, what string) {
		t.Helper()
		if got := eval[string](t, ctx, held); got != want {
			t.Errorf("%s: the tab holds the %s token", what, map[string]string{s.tokens.Viewer: "viewer's", s.tokens.Other: "other's"}[got])
		}
	}

	do(t, ctx, chromedp.Navigate(s.page(runs, s.tokens.Viewer)))
	waitFor(t, ctx, shown)
	checkHeld(s.tokens.Viewer, "signed in")

	// Someone else's link: the page asks, and the token leaves the address bar.
	do(t, ctx, chromedp.Navigate(s.page(runs, s.tokens.Other)))
	waitFor(t, ctx, asked)
	checkHeld(s.tokens.Viewer, "while asking")
	if got := eval[string](t, ctx, `location.hash`); got != "" {
		t.Errorf("the link's token stayed in the address bar: %q", got)
	}
	if got := eval[int](t, ctx, `document.querySelectorAll("#runs tbody tr").length`); got != 0 {
		t.Errorf("%d runs are shown while the page asks which token to use", got)
	}
	screenshot(t, ctx, "token-confirm.png")
	do(t, ctx, chromedp.Click("#token-keep"))
	waitFor(t, ctx, shown)
	checkHeld(s.tokens.Viewer, "kept")

	// The same link opened in a tab already on the view changes only the fragment.
	eval[string](t, ctx, fmt.Sprintf(`location.hash = "token=%s"`, s.tokens.Other))
	waitFor(t, ctx, asked)
	checkHeld(s.tokens.Viewer, "asked again")
	do(t, ctx, chromedp.Click("#token-replace"))
	waitFor(t, ctx, refused)
	checkHeld(s.tokens.Other, "replaced")

	// A link with the token the tab holds asks nothing.
	do(t, ctx, chromedp.Navigate(s.page(runs, s.tokens.Other)))
	waitFor(t, ctx, refused)
	if eval[bool](t, ctx, asked) {
		t.Error("a link with the token held asks whether to use it")
	}
}
