// What every page shares: the header with where one is, the live indicator, the token
// form and the messages.

import { setToken, type Failure } from "../api";
import { h, link, replace } from "../dom";
import type { Status } from "../live";

export interface Where {
  project?: string;
  domain?: string;
  run?: string;
  action?: string;
}

export interface Frame {
  main: HTMLElement;
  status(s: Status, detail?: string): void;
  /** fail shows what went wrong; a token failure brings the token form. */
  fail(f: Failure): void;
}

export function frame(root: HTMLElement, where: Where): Frame {
  const crumbs: (Node | string)[] = [link("Flyte console", {}, { class: "home" })];
  const { project, domain, run, action } = where;
  if (project && domain) crumbs.push(" / ", link(`${project} · ${domain}`, { project, domain }));
  if (run) crumbs.push(" / ", link(run, { project, domain, run }));
  if (action) crumbs.push(" / ", link(action, { project, domain, run, action }));
  const live = h("span", { id: "live", class: "status connecting" }, "connecting");
  const notice = h("div", { id: "notice" });
  const main = h("main", { id: "content" });
  replace(root, h("header", {}, h("nav", {}, ...crumbs), live), notice, main);
  document.title = [action, run, project && domain ? `${project}/${domain}` : "", "Flyte console"].filter(Boolean).join(" · ");
  return {
    main,
    status(s, detail) {
      live.className = `status ${s}`;
      live.textContent = s === "reconnecting" && detail ? `reconnecting (${detail})` : s;
    },
    fail(f) {
      live.className = "status stopped";
      live.textContent = "stopped";
      // What was shown before may be wrong for this identity; nothing is shown instead.
      main.replaceChildren();
      if (f.kind === "token") {
        replace(notice, tokenForm(f.message));
      } else {
        replace(notice, h("p", { class: "error", role: "alert" }, f.message));
      }
    },
  };
}

/**
 * tokenForm asks for a viewer's token once; it is kept in sessionStorage for this
 * browser session (until the tab closes) and sent as a bearer token.
 */
function tokenForm(message: string): HTMLElement {
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "off", required: "", placeholder: "token" });
  const form = h(
    "form",
    { id: "token-form", class: "token" },
    h("p", { id: "token-message", role: "alert" }, message),
    h("label", { for: "token" }, "Token "),
    input,
    h("button", { type: "submit" }, "Use this token"),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    setToken(input.value.trim());
    location.reload();
  });
  return form;
}

/** phaseBadge shows a phase as a coloured word. */
export function phaseBadge(name: string, label: string): HTMLElement {
  return h("span", { class: `phase phase-${name}` }, label);
}

/**
 * clusterFilter links to each cluster's actions, once actions of more than one cluster
 * are listed, or one is chosen. An executor that names no cluster has no link of its own.
 */
export function clusterFilter(clusters: Iterable<string>, chosen: string | undefined, params: Record<string, string | undefined>): HTMLElement | null {
  const names = [...new Set(clusters)].filter((c) => c).sort();
  if (chosen === undefined && names.length < 2) return null;
  return h(
    "p",
    { class: "filters", id: "clusters" },
    "Cluster: ",
    link("all", { ...params, cluster: undefined }, chosen === undefined ? { class: "current" } : {}),
    ...names.flatMap((c) => [" · ", link(c, { ...params, cluster: c }, chosen === c ? { class: "current" } : {})]),
  );
}
