// Building the page from data without HTML strings: text is always text (textContent),
// attributes are set one by one, and links go only to http(s) addresses, so nothing an
// event carries can run in the page.

export type Child = Node | string | number | null | undefined | false;

function append(el: Element, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.append(typeof c === "number" ? String(c) : c);
  }
}

/** h makes an HTML element with attributes and children. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | undefined> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined) el.setAttribute(k, v);
  }
  append(el, children);
  return el;
}

const svgNS = "http://www.w3.org/2000/svg";

/** s makes an SVG element; numbers are written as they are. */
export function s(tag: string, attrs: Record<string, string | number | undefined> = {}, ...children: Child[]): SVGElement {
  const el = document.createElementNS(svgNS, tag) as SVGElement;
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

/** setAttrs sets the attributes that are not undefined; numbers are written as s writes them. */
export function setAttrs(el: Element, attrs: Record<string, string | number | undefined>): void {
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined) el.setAttribute(k, typeof v === "number" ? String(Math.round(v * 100) / 100) : v);
  }
}

/** setText shows text in el, changing its one text node in place when it has one. */
export function setText(el: Element, text: string): void {
  const only = el.firstChild;
  if (only && only === el.lastChild && only.nodeType === Node.TEXT_NODE) {
    if ((only as Text).data !== text) (only as Text).data = text;
  } else {
    el.textContent = text;
  }
}

/** safeHref returns uri when it is an http(s) address, else undefined. */
export function safeHref(uri: string): string | undefined {
  try {
    const u = new URL(uri);
    return u.protocol === "http:" || u.protocol === "https:" ? u.href : undefined;
  } catch {
    return undefined;
  }
}

/** externalLink links to an http(s) address in a new tab, or shows a text that is not one. */
export function externalLink(text: string, uri: string): HTMLElement {
  const href = safeHref(uri);
  if (!href) return h("span", { class: "uri", title: "not an http(s) address" }, uri || text);
  return h("a", { href, target: "_blank", rel: "noopener noreferrer" }, text);
}

/** link is a link within the console to the view these query parameters name. */
export function link(text: string, params: Record<string, string | undefined>, attrs: Record<string, string> = {}): HTMLAnchorElement {
  return h("a", { ...attrs, href: viewURL(params) }, text);
}

export function viewURL(params: Record<string, string | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
  const query = q.toString();
  return query ? `?${query}` : "./";
}

/** replace puts children in place of el's. */
export function replace(el: Element, ...children: Child[]): void {
  el.replaceChildren();
  append(el, children);
}
