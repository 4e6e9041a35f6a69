// The console's entry: the query string names the view, so every view has a link
// (?project=P&domain=D, then &run=R, then &action=A; &phase=NAME filters lists, and
// &cluster=NAME lists and names one cluster's actions).

import { setToken, takeTokenFromFragment } from "./api";
import { h, replace } from "./dom";
import { actionPage } from "./pages/action";
import { runPage } from "./pages/run";
import { runsPage } from "./pages/runs";

function start(): void {
  const root = document.getElementById("app");
  if (!root) return;
  const offered = takeTokenFromFragment();
  if (offered) {
    replace(root, confirmToken(offered, () => show(root)));
    return;
  }
  show(root);
}

/** show starts the view the query string names. */
function show(root: HTMLElement): void {
  const q = new URLSearchParams(location.search);
  const project = q.get("project") ?? "";
  const domain = q.get("domain") ?? "";
  const run = q.get("run") ?? "";
  const action = q.get("action") ?? "";
  const cluster = q.get("cluster") ?? undefined;
  if (!project || !domain) {
    replace(root, chooser());
  } else if (run && action) {
    actionPage(root, { project, domain, run, action }, cluster);
  } else if (run) {
    runPage(root, project, domain, run, q.get("phase"), cluster);
  } else {
    runsPage(root, project, domain, q.get("phase"), cluster);
  }
}

/** chooser asks which project and domain to show; its form is read by this page's own query string. */
function chooser(): HTMLElement {
  return h(
    "main",
    {},
    h("h1", {}, "Flyte console"),
    h("p", {}, "Which project and domain?"),
    h(
      "form",
      { method: "get", action: "./", class: "choose" },
      h("label", {}, "project ", h("input", { name: "project", required: "", pattern: "[a-z0-9]+(-+[a-z0-9]+)*", value: "demo" })),
      " ",
      h("label", {}, "domain ", h("input", { name: "domain", required: "", pattern: "[a-z0-9]+(-+[a-z0-9]+)*", value: "development" })),
      " ",
      h("button", { type: "submit" }, "Show runs"),
    ),
  );
}

/**
 * confirmToken asks whether to replace the token this tab holds with the one a link
 * brought, which nothing has used yet; then it shows the view.
 */
function confirmToken(offered: string, then: () => void): HTMLElement {
  const choose = (replaceHeld: boolean) => () => {
    if (replaceHeld) setToken(offered);
    then();
  };
  const keep = h("button", { type: "button", id: "token-keep" }, "Keep the token I use");
  const use = h("button", { type: "button", id: "token-replace" }, "Use the link's token");
  keep.addEventListener("click", choose(false));
  use.addEventListener("click", choose(true));
  return h(
    "main",
    {},
    h("h1", {}, "Flyte console"),
    h(
      "form",
      { id: "token-confirm", class: "token" },
      h("p", { role: "alert" }, "This link carries a token other than the one this tab uses."),
      h("p", {}, "A link someone else sent would show what their token may read, as if it were yours. Use the link's token only if you meant to change it."),
      keep,
      " ",
      use,
    ),
  );
}

// A URL with a token opened in a tab already on that view changes only the fragment,
// which reloads nothing: the page starts again, and takes (or asks about) the token.
window.addEventListener("hashchange", () => {
  if (new URLSearchParams(location.hash.slice(1)).has("token")) location.reload();
});

start();
