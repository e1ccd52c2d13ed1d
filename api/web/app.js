// The gpuops dashboard (docs/dashboard.md): hash routes #/fleet, #/node/NAME, #/actions, #/replays.
// Every call goes to the API with the token from sessionStorage as a bearer token; a 401 shows the
// login box again. Text from the API is set as text (never as HTML).
"use strict";

const KEY = "gpuops.token";
const STATES = ["ok", "at_risk", "held", "unknown"];
const REFRESH_MS = 5000;
const $ = (id) => document.getElementById(id);

class AuthError extends Error {}

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "onclick") el.addEventListener("click", v);
    else if (v !== null && v !== undefined) el.setAttribute(k, v);
  }
  for (const c of children.flat()) el.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return el;
}

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(c));
  return el;
}

const time = (ts) => (ts ? new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "");
const pct = (x) => (x === null || x === undefined ? "" : (100 * x).toFixed(1) + " %");

async function api(path, opts = {}) {
  const headers = { Authorization: "Bearer " + sessionStorage.getItem(KEY) };
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method: opts.method || "GET", headers,
                                body: opts.body === undefined ? undefined : JSON.stringify(opts.body) });
  if (r.ok) return opts.raw ? r : r.json();
  const err = await r.json().catch(() => null);
  const msg = (err && err.error && err.error.message) || `${r.status} ${r.statusText}`;
  if (r.status === 401) {
    sessionStorage.removeItem(KEY);
    showLogin(msg);
    throw new AuthError(msg);
  }
  throw new Error(msg);
}

function flash(msg, error = false) {
  const f = $("flash");
  f.textContent = msg;
  f.className = error ? "error" : "";
  f.hidden = !msg;
}

function showLogin(msg = "") {
  $("login").hidden = false;
  $("view").replaceChildren();
  $("engine").replaceChildren();
  $("logout").hidden = true;
  $("login-error").textContent = msg;
}

// ---- engine bar (every page) ---------------------------------------------------------------
async function engineBar() {
  const e = await api("/v1/engine");
  const b = e.breaker || {};
  $("engine").replaceChildren(
    h("span", { class: "badge " + (e.armed ? "bad" : "good"), id: "engine-armed" }, e.armed ? "ARMED" : "dry run"),
    h("span", { class: "badge " + (e.paused ? "warn" : ""), id: "engine-paused" }, e.paused ? "paused" : "running"),
    h("span", { class: "badge " + (b.open ? "bad" : ""), id: "engine-breaker", title: b.why || "" },
      "breaker " + (b.open ? "OPEN" : "closed")),
    h("span", { class: "badge" }, `${e.adapter} · ${e.held.length} held`),
    ...Object.entries((e.budget || {}).braked || {}).map(([fault, why]) =>
      h("span", { class: "badge warn", id: `engine-braked-${fault}`, title: why }, `${fault} predictions braked`)));
}

// ---- fleet ---------------------------------------------------------------------------------
function groupOf(n) { return n.partition || n.rack || "fleet"; }

async function fleetPage(view) {
  const data = await api("/v1/nodes");
  const groups = new Map();
  for (const n of data.nodes) {
    if (!groups.has(groupOf(n))) groups.set(groupOf(n), []);
    groups.get(groupOf(n)).push(n);
  }
  const counts = STATES.map((s) => h("span", { class: s }, `${s} ${data.nodes.filter((n) => n.state === s).length}`));
  view.replaceChildren(
    h("h1", {}, `Fleet: ${data.count} nodes`),
    h("p", { class: "legend" }, counts, h("span", { class: "muted" }, data.ts ? "as of " + time(data.ts) : "no scores yet")),
    ...[...groups].sort().map(([g, nodes]) => h("section", { class: "group" }, h("h2", {}, `${g} (${nodes.length})`),
      h("div", { class: "tiles" }, nodes.map((n) =>
        h("button", { class: "tile " + n.state, "data-node": n.node, "data-state": n.state, type: "button",
                      title: `${n.node}: ${n.state}, risk ${pct(n.risk)}${n.fault ? ", " + n.fault : ""}`,
                      onclick: () => { location.hash = "#/node/" + encodeURIComponent(n.node); } },
          h("span", { class: "name" }, n.node), `${pct(n.risk)} ${n.fault || ""}`))))));
}

// ---- node ----------------------------------------------------------------------------------
function plot(history, threshold = 0.3) {
  const W = 720, H = 200, L = 40, B = 22, T = 8, R = 8;
  const s = svg("svg", { class: "plot", id: "risk-plot", width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  if (!history.length) { s.append(svg("text", { x: L, y: H / 2 }, "no history yet")); return s; }
  const t0 = history[0].ts, t1 = Math.max(history[history.length - 1].ts, t0 + 1);
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => T + (1 - Math.min(1, Math.max(0, v))) * (H - T - B);
  const line = (key) => history.map((p, i) => `${i ? "L" : "M"}${x(p.ts).toFixed(1)},${y(p[key]).toFixed(1)}`).join("");
  s.append(svg("line", { class: "axis", x1: L, y1: y(0), x2: W - R, y2: y(0) }),
           svg("line", { class: "axis", x1: L, y1: y(0), x2: L, y2: y(1) }),
           svg("line", { class: "threshold", x1: L, y1: y(threshold), x2: W - R, y2: y(threshold) }),
           svg("text", { x: 4, y: y(1) + 4 }, "100%"), svg("text", { x: 4, y: y(0) }, "0%"),
           svg("text", { x: L, y: H - 4 }, time(t0)), svg("text", { x: W - R - 130, y: H - 4 }, time(t1)),
           svg("path", { class: "anomaly", d: line("anomaly") }), svg("path", { class: "risk", d: line("risk") }));
  return s;
}

const table = (cols, rows, attrs = {}) => h("table", attrs,
  h("tr", {}, cols.map((c) => h("th", {}, c))), rows);

function actionRows(actions, buttons = false) {
  return actions.map((a) => h("tr", { "data-id": a.id, "data-state": a.state },
    h("td", {}, time(a.created_at)), h("td", {}, a.node), h("td", {}, a.kind + (a.gpu != null ? ` gpu ${a.gpu}` : "") + (a.escalates ? " (escalation)" : "")),
    h("td", { class: "state" }, a.state + (a.dry_run ? " (dry run)" : "")),
    h("td", {}, a.reason, a.blocked_by ? h("div", { class: "muted" }, "held back: " + a.blocked_by) : "",
      a.verdict ? h("div", { class: "muted" }, "verdict: " + a.verdict) : ""),
    h("td", {}, a.actor),
    buttons ? h("td", {}, h("button", { class: "approve", type: "button", onclick: () => decide(a, "approve") }, "Approve"),
                " ", h("button", { class: "reject", type: "button", onclick: () => decide(a, "reject") }, "Reject")) : ""));
}

// a held node: who took it out, and what its resume still waits for (api/holds.py)
function holdPanel(hold) {
  const gpus = hold.gpus_reading == null ? "" : h("p", {}, `GPUs reading ${hold.gpus_reading}, lost ${hold.gpus_lost || 0}` +
    (hold.gpus_when_taken_out == null ? "" : `, ${hold.gpus_when_taken_out} when taken out`));
  const waits = hold.waiting_for.length ? hold.waiting_for : ["nothing: it is resumed at the next tick"];
  return h("section", { id: "node-hold" }, h("h2", {}, "Held"),
    h("p", {}, `${hold.kind} by ${hold.actor} at ${time(hold.since)} (${hold.fault || "no fault named"}): ${hold.reason}`),
    gpus, h("ul", {}, ...waits.map((w) => h("li", {}, "resume waits for: " + w))));
}

async function nodePage(view, name) {
  const n = await api("/v1/nodes/" + encodeURIComponent(name));
  const kv = (o) => h("dl", {}, Object.entries(o).flatMap(([k, v]) =>
    [h("dt", {}, k), h("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v))]));
  view.replaceChildren(
    h("h1", {}, h("span", { class: "badge " + n.state }, n.state), " ", n.node),
    kv({ risk: pct(n.risk), fault: n.fault || "none", gpu: n.gpu, anomaly: n.anomaly,
         rule: n.rule ?? "none", "last score": time(n.ts),
         // precursor signals this node does not send: its faults of those classes are seen only when they happen
         "signals not sent": n.blind_signals == null ? "not known yet"
           : n.blind_signals.length ? n.blind_signals.join(", ") + " (see GET /v1/coverage)" : "none" }),
    n.hold ? holdPanel(n.hold) : "",
    // after a prediction that did not come true: which of its predictions only alert, until when (api/holds.py)
    n.retry_cap ? h("section", { id: "node-retry-cap" }, h("h2", {}, "Predictions held back"),
      h("p", {}, `until ${time(n.retry_cap.until)}: ${n.retry_cap.reason}`)) : "",
    h("h2", {}, "Risk over time"), plot(n.history),
    h("p", { class: "muted" }, "solid: failure risk; dashed: anomaly; dotted: the at-risk line"),
    h("h2", {}, "Why"), Object.keys(n.reasons).length ? kv(n.reasons) : h("p", { class: "muted" }, "no reasons given"),
    Object.keys(n.detail).length ? [h("h2", {}, "Features"), kv(n.detail)] : "",
    h("h2", {}, "Actions"),
    table(["created", "node", "kind", "state", "reason", "actor"], actionRows(n.actions), { id: "node-actions" }),
    h("h2", {}, "Events"),
    table(["time", "kind", "detail"], n.events.slice().reverse().map((e) => h("tr", {},
      h("td", {}, time(e.ts)), h("td", {}, e.kind || e.type || ""),
      h("td", {}, JSON.stringify(Object.fromEntries(Object.entries(e).filter(([k]) => !["ts", "node", "kind"].includes(k)))))))));
}

// ---- action queue --------------------------------------------------------------------------
async function decide(a, verb) {
  const note = window.prompt(`${verb} ${a.kind} on ${a.node}: a note for the audit trail`, "");
  if (note === null) return;
  try {
    const r = await api(`/v1/actions/${encodeURIComponent(a.id)}/${verb}`, { method: "POST", body: { note } });
    flash(`${verb === "approve" ? "Approved" : "Rejected"} ${r.kind} on ${r.node}: now ${r.state}`);
  } catch (e) {
    if (!(e instanceof AuthError)) flash(`${verb} refused: ${e.message}`, true);
  }
  route();
}

async function actionsPage(view) {
  const [queue, recent] = await Promise.all([api("/v1/actions?state=proposed&limit=100"), api("/v1/actions?limit=30")]);
  view.replaceChildren(
    h("h1", {}, `Action queue: ${queue.count} waiting`),
    h("p", { class: "muted" }, "Proposals that wait for a person. Approving or rejecting needs an operator token."),
    table(["created", "node", "kind", "state", "reason", "actor", ""], actionRows(queue.actions, true), { id: "queue" }),
    h("h2", {}, "Recent actions"),
    table(["created", "node", "kind", "state", "reason", "actor"], actionRows(recent.actions), { id: "recent" }));
}

// ---- replays -------------------------------------------------------------------------------
async function openReport(id) {
  try {   // fetched with the token, shown from a blob: the token never goes into a URL
    const r = await api(`/v1/replays/${encodeURIComponent(id)}/report.html`, { raw: true });
    window.open(URL.createObjectURL(await r.blob()), "_blank");
  } catch (e) {
    if (!(e instanceof AuthError)) flash(`report: ${e.message}`, true);
  }
}

async function replaysPage(view) {
  const { jobs } = await api("/v1/replays");
  view.replaceChildren(h("h1", {}, "Replays"),
    h("p", { class: "muted" }, "Start one with gpuops replay or POST /v1/replays; finished ones open as HTML reports."),
    table(["created", "recording", "state", "progress", "report"], jobs.map((j) => h("tr", {},
      h("td", {}, time(j.created_at)), h("td", {}, j.params.recording || ""), h("td", {}, j.state + (j.error ? ": " + j.error : "")),
      h("td", {}, pct(j.progress)),
      h("td", {}, j.state === "succeeded" ? h("button", { type: "button", onclick: () => openReport(j.id) }, "HTML report") : "")))));
}

// ---- routing -------------------------------------------------------------------------------
let routing = 0;   // routes in flight: the timer never redraws over one

async function route() {
  if (!sessionStorage.getItem(KEY)) { showLogin(); return; }
  $("login").hidden = true;
  $("logout").hidden = false;
  const [, page, arg] = (location.hash || "#/fleet").split("/");
  for (const p of ["fleet", "actions", "replays"]) $("nav-" + p).classList.toggle("active", p === page);
  const view = $("view");
  view.dataset.page = page || "fleet";
  routing += 1;
  try {
    await engineBar();
    if (page === "node" && arg) await nodePage(view, decodeURIComponent(arg));
    else if (page === "actions") await actionsPage(view);
    else if (page === "replays") await replaysPage(view);
    else await fleetPage(view);
  } catch (e) {
    if (!(e instanceof AuthError)) flash(e.message, true);
  } finally {
    routing -= 1;
  }
}

$("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(KEY, $("token").value.trim());
  $("token").value = "";
  flash("");
  route();
});
$("logout").addEventListener("click", () => { sessionStorage.removeItem(KEY); showLogin(); });
window.addEventListener("hashchange", () => { flash(""); route(); });
// the engine bar stays current on every page; the fleet redraws too (other pages redraw on each action)
setInterval(() => {
  if (!sessionStorage.getItem(KEY) || !$("login").hidden || document.hidden || routing) return;
  if ($("view").dataset.page === "fleet") route(); else engineBar().catch(() => {});
}, REFRESH_MS);
route();
