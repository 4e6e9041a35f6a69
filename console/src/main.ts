// The console's entry: the query string names the view, so every view has a link
// (?project=P&domain=D, then &run=R, then &action=A; &phase=NAME filters lists).

import { takeTokenFromFragment } from "./api";
import { h, replace } from "./dom";
import { actionPage } from "./pages/action";
import { runPage } from "./pages/run";
import { runsPage } from "./pages/runs";

function start(): void {
  takeTokenFromFragment();
  const root = document.getElementById("app");
  if (!root) return;
  const q = new URLSearchParams(location.search);
  const project = q.get("project") ?? "";
  const domain = q.get("domain") ?? "";
  const run = q.get("run") ?? "";
  const action = q.get("action") ?? "";
  if (!project || !domain) {
    replace(root, chooser());
  } else if (run && action) {
    actionPage(root, { project, domain, run, action });
  } else if (run) {
    runPage(root, project, domain, run, q.get("phase"));
  } else {
    runsPage(root, project, domain, q.get("phase"));
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

// A URL with a token opened in a tab already on that view changes only the fragment,
// which reloads nothing: the token is taken and the view started again with it.
window.addEventListener("hashchange", () => {
  if (new URLSearchParams(location.hash.slice(1)).has("token")) {
    takeTokenFromFragment();
    location.reload();
  }
});

start();
