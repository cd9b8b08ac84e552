// capledger operator console. A client of the public JSON API (Connect
// JSON: POST /capledger.v1.<Service>/<Method>) with the caller's bearer
// token; it computes nothing the API does not answer except rates between
// two answers and sums of what it shows. See docs/CONSOLE.md.
"use strict";

const TOKEN_KEY = "capledger.token";
const REFRESH_MS = 5000;
// The rate charts cover at most this long. By time, not by a count of
// samples: a background tab's timers fire far less often than every 5 s.
const HISTORY_SECONDS = 900;

// ---- API ---------------------------------------------------------------

class APIError extends Error {
  constructor(status, code, message) {
    super(message || code || ("HTTP " + status));
    this.status = status;
    this.code = code || "";
  }
}

async function call(service, method, body) {
  const headers = { "Content-Type": "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers["Authorization"] = "Bearer " + token;
  let resp;
  try {
    resp = await fetch("/capledger.v1." + service + "/" + method, {
      method: "POST", headers, body: JSON.stringify(body || {}), cache: "no-store",
    });
  } catch (err) {
    // No HTTP answer at all: the server is down or the network is.
    throw new APIError(0, "unreachable", err.message);
  }
  let payload = {};
  try { payload = await resp.json(); } catch (e) { payload = {}; }
  if (!resp.ok) throw new APIError(resp.status, payload.code, payload.message);
  return payload;
}
const ledger = (m, b) => call("LedgerService", m, b);

// POLICY_PAGE is how many generations the Policies page shows at once.
const POLICY_PAGE = 100;

// fullPage asks a list method of service for up to size rows (field
// names them), following nextPageToken while the rows fall short: a
// scoped token's reads are bounded per call, so a short or empty page with
// a token means "keep paging" (API.md). body may carry the first
// pageToken. At most 8 calls; the answer is the last page's (its
// nextPageToken is where the next page starts) with the rows (and
// overdueReservationIds) of all of them.
async function fullPage(service, method, body, field, size) {
  let resp = await call(service, method, Object.assign({}, body, { pageSize: size }));
  const rows = resp[field] || [];
  const overdue = resp.overdueReservationIds || [];
  for (let calls = 1; resp.nextPageToken && rows.length < size && calls < 8; calls++) {
    resp = await call(service, method, Object.assign({}, body, { pageSize: size - rows.length, pageToken: resp.nextPageToken }));
    rows.push(...(resp[field] || []));
    overdue.push(...(resp.overdueReservationIds || []));
  }
  resp[field] = rows;
  if (overdue.length) resp.overdueReservationIds = overdue;
  return resp;
}
const ledgerPage = (m, b, field, size) => fullPage("LedgerService", m, b, field, size);
const console_ = (m, b) => call("ConsoleService", m, b);
const shards = (m, b) => call("ShardService", m, b);
const rollouts = (m, b) => call("RolloutService", m, b);

// ---- formatting --------------------------------------------------------

// protojson writes 64-bit integers as strings and leaves zeros out.
const n = (v) => (v === undefined || v === null || v === "" ? 0 : Number(v));
// Every number the page shows goes through fmtInt or fmtDec: thousands
// separated, the same everywhere.
const fmtInt = (v) => n(v).toLocaleString("en-US");
const fmtDec = (v, digits) => n(v).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
// plural is the word for v things: one when v is 1, else many ("batch",
// "batches"; many defaults to one + "s"). Every count the page writes out
// in words goes through it, so "1 account" never reads "1 accounts".
const plural = (v, one, many) => (n(v) === 1 ? one : many || one + "s");
const fmtPct = (f) => fmtDec(100 * f, 1) + "%";
const fmtSec = (s) => (s >= 1 ? fmtDec(s, 2) + " s" : (s * 1000).toFixed(s < 0.01 ? 2 : 1) + " ms");
const fmtTime = (t) => (t ? new Date(t).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "—");
function fmtAge(t, now) {
  if (!t) return "—";
  let s = Math.max(0, Math.round(((now || Date.now()) - new Date(t).getTime()) / 1000));
  if (s < 120) return s + " s";
  if (s < 7200) return Math.round(s / 60) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return fmtDec(s / 86400, 1) + " d";
}
const mode = (m) => (m || "ROLLOUT_MODE_ENFORCE").replace("ROLLOUT_MODE_", "").toLowerCase();
// modeShown is a generation's rollout mode as the Tenants and the Policies
// pages both show it: the mode its reserves get now (now: the API's
// AccountStanding.rollout or Policy.rolloutNow), with the generation's own
// after it where a staged rollout decides otherwise. Without now the
// reserves have no one mode: a "*" generation whose route a rollout hashes
// by subject.
function modeShown(now, own) {
  if (!now) return "per subject (a rollout hashes them), own " + mode(own);
  return mode(now) === mode(own) ? mode(now) : mode(now) + " (rollout; own " + mode(own) + ")";
}
const stateName = (s) => (s || "").replace("RESERVATION_STATE_", "");
const units = (m) => Object.entries(m || {}).map(([k, v]) => k + " " + fmtInt(v)).join(", ") || "—";
// repaidBy says when refill repays a standing dimension's debt. The server
// leaves repaidAt out both without a refill rule and when the wait is
// beyond what it computes (about 292 years): the refill rule tells which.
const repaidBy = (d) => (d.repaidAt ? fmtTime(d.repaidAt)
  : n(d.refillUnits) > 0 && d.refillInterval ? "more than 292 years off" : "no refill rule");

// el builds an element: el("td", {class: "num", "data-field": "x"}, "text", child...).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "onclick" || k === "onsubmit" || k === "oninput" || k === "onscroll") e[k] = v; else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}
function table(headers, rows, empty) {
  if (!rows.length) return el("p", { class: "empty", "data-empty": "1" }, empty || "None.");
  // In a box of its own that scrolls sideways when the table is wider
  // than the window, so the page itself never does; the box's edges fade
  // where more columns lie beyond (markScrollHint).
  const wrap = el("div", { class: "table-wrap", onscroll: (e) => markScrollHint(e.target) }, el("table", {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { class: h.num ? "num" : null }, h.label || h)))),
    el("tbody", {}, rows)));
  return el("div", { class: "table-box" }, wrap);
}
// markScrollHint sets the table box's data-more to the edges ("left",
// "right") beyond which its table goes on, or removes it when the table
// fits: style.css fades those edges. Scroll bars that show only while
// scrolling (headless Chromium's, macOS's) give no other hint that more
// columns are there.
function markScrollHint(wrap) {
  const more = [];
  if (wrap.scrollLeft > 0) more.push("left");
  if (wrap.scrollLeft + wrap.clientWidth < wrap.scrollWidth - 1) more.push("right");
  if (more.length) wrap.parentElement.setAttribute("data-more", more.join(" "));
  else wrap.parentElement.removeAttribute("data-more");
}
// markScrollHints marks every table box under root, once it is laid out.
const markScrollHints = (root) => root.querySelectorAll(".table-wrap").forEach(markScrollHint);
const td = (field, value, num) => el("td", { "data-field": field, class: num ? "num" : null }, value);
const card = (id, label, value, sub, cls) =>
  el("div", { class: "card", "data-card": id }, el("div", { class: "label" }, label),
    el("div", { class: "value " + (cls || ""), "data-value": id }, value), sub ? el("div", { class: "sub" }, sub) : null);
function bar(frac) {
  const w = Math.max(0, Math.min(1, frac));
  return el("span", { class: "bar" }, el("span", { class: frac >= 0.9 ? "hot" : null, style: "width:" + (100 * w).toFixed(0) + "%" }));
}

// ---- charts (uPlot) ----------------------------------------------------

// Series is a chart's samples (t in seconds), keeping only those of the
// last windowSeconds before the newest when it is given.
class Series {
  constructor(names, windowSeconds) { this.names = names; this.windowSeconds = windowSeconds; this.t = []; this.v = names.map(() => []); }
  push(t, values) {
    this.t.push(t);
    this.names.forEach((name, i) => this.v[i].push(values[name] ?? 0));
    while (this.windowSeconds && this.t[0] < t - this.windowSeconds) { this.t.shift(); this.v.forEach((a) => a.shift()); }
  }
  // ensure adds series that appeared since (a new generation), with zeros
  // for the samples taken before.
  ensure(names) {
    for (const name of names) {
      if (!this.names.includes(name)) { this.names.push(name); this.v.push(this.t.map(() => 0)); }
    }
  }
  data() { return [this.t, ...this.v]; }
}
// utcTicks labels the time axis in UTC, as fmtTime writes every other time
// on the page (and the API answers them): uPlot would use the browser's
// zone. Seconds, minutes or days by the spacing of the ticks.
function utcTicks(u, splits, axisIdx, space, incr) {
  return splits.map((t) => {
    const iso = new Date(t * 1000).toISOString();
    return incr < 60 ? iso.slice(11, 19) : incr < 86400 ? iso.slice(11, 16) : iso.slice(0, 10);
  });
}
const palette = ["#2e90fa", "#f04438", "#12b76a", "#f79009", "#7a5af8", "#ee46bc", "#667085", "#0ba5ec"];
function chart(container, title, series, yLabel, emptyText) {
  const opts = {
    title, width: 440, height: 220,
    scales: { x: { time: true } },
    // Ticks fall on whole UTC minutes, hours and days, labelled in UTC.
    tzDate: (t) => uPlot.tzDate(new Date(t * 1000), "Etc/UTC"),
    axes: [{ label: "time (UTC)", values: utcTicks }, { label: yLabel, size: 60 }],
    series: [{ label: "time (UTC)", value: (u, t) => (t == null ? "--" : fmtTime(t * 1000)) }].concat(series.names.map((name, i) => ({ label: name, stroke: palette[i % palette.length], width: 2 }))),
  };
  const box = el("div", { class: "chart", "data-chart": title });
  container.append(box);
  if (series.t.length < 2) {
    box.append(el("p", { class: "empty" }, title + ": " + (emptyText || "the chart fills in as this page samples the API every " + REFRESH_MS / 1000 + " s.")));
    return;
  }
  // Kept on the box: the browser tests read the axis labels drawn.
  box.uplot = new uPlot(opts, series.data(), box);
}

// ---- state -------------------------------------------------------------

const state = {
  prevOverview: null,
  decisionRates: null, // Series of decisions/s by outcome
  rejectionRates: null, // Series of 429/s by dimension
  reservationPages: {}, // subject -> page tokens of its reservations list (the first is "")
  policyPages: [""], // page tokens of the Policies page's generations (the first is "")
  lastAudit: null, // the audit this page ran, if any
  auditError: null, // why the last audit this page asked for was not run
  timer: null,
  seq: 0, // the latest render; an older one still in flight is dropped
};

// showError shows err above the page (hides the box without one);
// staleSince is when the data still shown was read, when the page kept it.
function showError(err, staleSince) {
  const box = document.getElementById("error");
  if (!err) { box.hidden = true; box.textContent = ""; return; }
  let text = err.message;
  if (err.code === "unreachable") {
    text = "Cannot reach the server (" + err.message + "); trying again every " + REFRESH_MS / 1000 + " s." +
      (staleSince ? " What is shown was read at " + fmtTime(staleSince) + "." : "");
  }
  if (err.status === 401) {
    text = sessionStorage.getItem(TOKEN_KEY)
      ? "The server refused this tab's token (" + err.message + "): type another above, or Forget it."
      : "This server wants a bearer token (" + err.message + "): type one above.";
  }
  if (err.status === 403) text = "Your token's role may not read this (" + err.message + ").";
  box.textContent = text;
  box.hidden = false;
}

function tokenState() {
  const t = sessionStorage.getItem(TOKEN_KEY);
  document.getElementById("token-state").textContent = t ? "token set (this tab)" : "no token";
}

// ---- pages -------------------------------------------------------------

const pages = {};

pages.overview = async function (main) {
  const ov = await console_("GetOverview");
  const now = new Date(ov.serverTime).getTime();
  main.append(el("h1", {}, "Overview"));
  const ready = !!ov.ready;
  const cards = el("div", { class: "cards" },
    card("ready", "Readiness", ready ? "ready" : "not ready", ov.readyError || (ov.workerLeader ? "runs the workers (leader)" : "not the worker leader"), ready ? "ok" : "bad"));
  main.append(cards);
  if (ov.scoped) {
    main.append(el("p", { class: "note", "data-scoped": "1" },
      "Your token is scoped to some tenants: this replica's counters, commit latency, backlog and audit count every tenant, so they are not shown. The other pages show your tenants."));
    return;
  }
  const backlog = n(ov.usageUnknownBacklog);
  cards.append(card("backlog", "USAGE_UNKNOWN backlog", fmtInt(backlog),
    backlog ? "oldest " + fmtAge(ov.oldestUsageUnknownAt, now) + " ago" : "nothing waiting", backlog ? "warn" : "ok"));
  const c = ov.commit || {};
  const batches = n(c.batches);
  cards.append(card("commit", "Commit latency (p50 / p99)", batches ? fmtSec(n(c.p50Seconds)) + " / " + fmtSec(n(c.p99Seconds)) : "—",
    batches ? fmtInt(batches) + " " + plural(batches, "batch", "batches") + ", mean " + fmtSec(n(c.sumSeconds) / batches) + " (bucket bounds)" : "no batch yet"));
  const a = ov.audit;
  let auditCard;
  if (!a) {
    auditCard = card("audit", "Audit", "not run", "no audit recorded");
  } else {
    const found = n(a.lastDiscrepancies);
    const who = (by, how) => " by " + (by || "(auth off)") + ", " + (how || "full").replace("_", " ");
    auditCard = card("audit", "Audit", found ? fmtInt(found) + " " + plural(found, "discrepancy", "discrepancies") : "clean", null, found ? "bad" : "ok");
    auditCard.append(el("div", { class: "sub" }, "last ", el("span", { "data-value": "audit-last" }, fmtTime(a.lastAuditAt)),
      a.persisted ? el("span", { "data-value": "audit-last-by" }, who(a.lastBy, a.lastMode)) : null));
    auditCard.append(el("div", { class: "sub" }, "last clean ", el("span", { "data-value": "audit-clean" }, fmtTime(a.lastCleanAuditAt)),
      a.persisted && a.lastCleanAuditAt ? el("span", { "data-value": "audit-clean-by" }, who(a.lastCleanBy, a.lastCleanMode)) : null));
    if ((a.lastChecks || []).length) {
      auditCard.append(el("div", { class: "sub" }, (a.lastChecks || []).map((c) =>
        el("span", { "data-check": c.check }, c.check + " " + fmtInt(c.count) + " "))));
    }
    auditCard.append(el("div", { class: "sub", "data-value": "audit-source" },
      a.persisted ? "recorded in the store: the same on every replica" : "this replica's memory since it started"));
  }
  auditCard.append(el("div", {}, el("button", { id: "run-audit", onclick: runAudit }, "Run audit (admin)")));
  const ae = state.auditError;
  if (ae) {
    auditCard.append(el("div", { class: "sub bad", "data-value": "audit-error" },
      (ae.status === 403 ? "Not run: running the audit needs an admin token (" : "Not run (") + ae.message + ")."));
  }
  cards.append(auditCard);

  // Rates: differences of cumulative counters between two answers.
  const decided = {}, rejected = {};
  for (const d of ov.decisions || []) decided["g" + n(d.policyGeneration) + " " + d.outcome] = n(d.count);
  for (const r of ov.rejections || []) if (r.rollout === "enforce") rejected[r.dimension] = (rejected[r.dimension] || 0) + n(r.count);
  const prev = state.prevOverview;
  if (!state.decisionRates) state.decisionRates = new Series([], HISTORY_SECONDS);
  state.decisionRates.ensure(Object.keys(decided).sort());
  const dims = Object.keys(rejected).sort();
  if (!state.rejectionRates || state.rejectionRates.names.join() !== dims.join()) state.rejectionRates = new Series(dims, HISTORY_SECONDS);
  if (prev && now > prev.at) {
    const dt = (now - prev.at) / 1000;
    const rate = (cur, old) => Object.fromEntries(Object.keys(cur).map((k) => [k, Math.max(0, (cur[k] - (old[k] || 0)) / dt)]));
    state.decisionRates.push(now / 1000, rate(decided, prev.decided));
    state.rejectionRates.push(now / 1000, rate(rejected, prev.rejected));
  }
  state.prevOverview = { at: now, decided, rejected };
  const charts = el("div", {});
  main.append(el("h2", {}, "Rates (sampled by this page)"), charts);
  if (state.decisionRates.names.length) chart(charts, "decisions/s by generation and outcome", state.decisionRates, "per s");
  if (dims.length) chart(charts, "429/s by limiting dimension", state.rejectionRates, "per s");

  main.append(el("h2", {}, "Reserve decisions by generation (since this replica started)"));
  main.append(table(["generation", "outcome", { label: "count", num: true }],
    (ov.decisions || []).map((d) => el("tr", { "data-key": "g" + n(d.policyGeneration) + "/" + d.outcome },
      td("generation", n(d.policyGeneration)), td("outcome", d.outcome), td("count", fmtInt(d.count), true))),
    "No reserve decided yet."));
  main.append(el("h2", {}, "Capacity rejections (429) by limiting dimension"));
  main.append(table(["dimension", "reason", "rollout", { label: "count", num: true }],
    (ov.rejections || []).map((r) => el("tr", { "data-key": r.dimension + "/" + r.reason + "/" + r.rollout },
      td("dimension", r.dimension), reasonCell(r.reason), td("rollout", r.rollout), td("count", fmtInt(r.count), true))),
    "No capacity rejection yet."));
  main.append(el("h2", {}, "Commands by kind and outcome"));
  main.append(table(["kind", "outcome", { label: "count", num: true }],
    (ov.commands || []).map((c) => el("tr", { "data-key": c.kind + "/" + c.outcome },
      td("kind", c.kind), td("outcome", c.outcome), td("count", fmtInt(c.count), true))),
    "No command yet."));
  if (state.lastAudit) main.append(auditTable(state.lastAudit));
};

// runAudit runs the audit; a refusal (a viewer's token) or failure stays
// in the audit card until the next run or token, where the page's error
// box would be cleared by the next refresh.
async function runAudit() {
  try {
    state.lastAudit = await ledger("Audit");
    state.auditError = null;
  } catch (err) { state.auditError = err; }
  render();
}

function auditTable(audit, only) {
  const found = (audit.discrepancies || []).filter((d) => !only || d.check === only);
  return el("div", { "data-audit": "1" },
    el("h2", {}, "Discrepancies of the audit run from this page at " + fmtTime(audit.checkedAt)),
    table(["check", "account", "reservation", "detail"],
      found.map((d) => el("tr", {}, td("check", d.check), td("account", d.account || ""), td("reservation", d.reservationId || ""), td("detail", d.detail || ""))),
      "None: the ledger is sound."));
}

// tenantLink links a subject to its tenant page on route @ region.
const tenantLink = (subject, route, region) => el("a", { class: "subject",
  href: "#tenants/" + encodeURIComponent(subject) + "/" + encodeURIComponent(route) + "/" + encodeURIComponent(region || "global") }, subject);

function standingRow(s) {
  const acc = s.account;
  const key = acc.subject + "/" + acc.route + "@" + acc.region + "#" + n(acc.policyGeneration);
  const dims = s.dimensions || [];
  const repaid = dims.filter((d) => n(d.debt)).map((d) => d.unit + " " + repaidBy(d)).join(", ");
  // A generation that does not decide admits nothing: how empty it is
  // says nothing about a limit (a republish moves its capacity to the new
  // generation and leaves it empty), so it shows what is left to drain
  // (available + reserved + debt, as the Policies page counts it), with
  // its used fraction in the tooltip; the server ranks it after the
  // active ones.
  let left = 0;
  for (const b of acc.balances || []) left += n(b.available) + n(b.reserved) + n(b.debt);
  const used = s.active ? el("span", {}, bar(n(s.usedFraction)), fmtPct(n(s.usedFraction)))
    : el("span", { title: fmtPct(n(s.usedFraction)) + " used; its generation admits nothing" }, left ? fmtInt(left) + " left" : "drained");
  return el("tr", { "data-key": key, class: acc.frozen ? "frozen" : null },
    td("subject", tenantLink(acc.subject, acc.route, acc.region)),
    td("route", acc.route), td("region", acc.region), td("generation", n(acc.policyGeneration)),
    td("used", used, true),
    td("available", dims.map((d) => d.unit + " " + fmtInt(d.available) + "/" + fmtInt(d.burst)).join(", ")),
    td("debt", dims.filter((d) => n(d.debt)).map((d) => d.unit + " " + fmtInt(d.debt)).join(", ") || "0"),
    td("repaid", repaid || "—"),
    td("state", [(s.active ? "active" : (s.rolledBack ? "rolled back" : "superseded") + (left ? "" : ", drained")) + ", ",
      el("span", { "data-mode": "g" + n(acc.policyGeneration) }, modeShown(s.rollout, s.policyRollout))]));
}
const standingHeaders = ["subject", "route", "region", "gen", { label: "used", num: true }, "available / burst", "debt", "debt repaid by refill at", "generation"];

pages.tenants = async function (main, args) {
  if (args.length >= 2) return tenantDetail(main, args[0], args[1], args[2] || "global");
  main.append(el("h1", {}, "Tenants"));
  const q = sessionStorage.getItem("capledger.search") || "";
  const limit = Number(sessionStorage.getItem("capledger.limit") || 20);
  const form = el("form", { class: "filters", id: "search", onsubmit: (e) => {
    e.preventDefault();
    sessionStorage.setItem("capledger.search", document.getElementById("search-subject").value);
    sessionStorage.setItem("capledger.limit", document.getElementById("search-limit").value);
    render();
  } },
  "subject contains", el("input", { id: "search-subject", value: q }),
  "top", el("input", { id: "search-limit", type: "number", min: 1, max: 1000, value: limit, style: "width:70px" }),
  el("button", { type: "submit" }, "Search"));
  main.append(form);
  const resp = await console_("ListAccountStandings", { subjectContains: q, limit });
  main.append(el("p", { class: "note" }, "Nearest their limit first (accounts in debt before all others; generations that no longer decide after the active ones): ",
    el("span", { "data-value": "matched" }, fmtInt(resp.matched)), " " + plural(resp.matched, "account matches", "accounts match") + ", showing ",
    fmtInt((resp.accounts || []).length), "; accounts read at ", el("span", { "data-value": "asOf" }, fmtTime(resp.asOf)),
    " (one ranking of every account is shared and given again for a while: API.md)."));
  main.append(table(standingHeaders, (resp.accounts || []).map(standingRow), "No account matches."));
};

async function tenantDetail(main, subject, route, region) {
  subject = decodeURIComponent(subject); route = decodeURIComponent(route); region = decodeURIComponent(region);
  main.append(el("p", {}, el("a", { href: "#tenants" }, "← all tenants")));
  main.append(el("h1", {}, "Tenant ", el("span", { "data-value": "subject" }, subject), " on ", route, " @ ", region));
  const [acc, standing, unknown] = await Promise.all([
    ledger("GetAccount", { subject, route, region }),
    // Exactly this subject's accounts on this route: subjectContains
    // would match t10 .. t19999 for t1, and the limit could leave t1 out.
    console_("ListAccountStandings", { subject, route, region, limit: 1000 }),
    ledger("ListUsageUnknown", { subject, route, pageSize: 1000 }).catch((err) => ({ error: err })),
  ]);
  const accounts = acc.accounts || [];
  if (!accounts.length) { main.append(el("p", { class: "empty" }, "This subject has no account on this route (it never reserved).")); return; }
  main.append(table(standingHeaders, (standing.accounts || []).map(standingRow)));
  const now = Date.now();
  for (const a of accounts) {
    const gen = n(a.policyGeneration);
    main.append(el("h2", {}, "Generation " + gen + " — balances (conservation terms, cumulative)" + (a.frozen ? " — FROZEN by debt" : "")));
    const terms = ["opening", "minted", "overdraftIssued", "available", "reserved", "spent", "retiredForEmergency", "retiredForMove", "overdraftRepaid", "debt", "heldElsewhere"];
    // heldElsewhere is not a conservation term: on the current account, what the subject's
    // other generations still hold reserved in the unit (refill stops at burst - reserved - it).
    const labels = { overdraftIssued: "overdraft issued", retiredForEmergency: "retired (emergency)", retiredForMove: "retired (move)", overdraftRepaid: "overdraft repaid", heldElsewhere: "held elsewhere" };
    main.append(table(["unit"].concat(terms.map((t) => ({ label: labels[t] || t, num: true }))).concat([{ label: "in = out", num: true }]),
      (a.balances || []).map((b) => {
        const lhs = n(b.opening) + n(b.minted) + n(b.overdraftIssued);
        const rhs = n(b.available) + n(b.reserved) + n(b.spent) + n(b.retiredForEmergency) + n(b.retiredForMove) + n(b.overdraftRepaid);
        return el("tr", { "data-key": "g" + gen + "/" + b.unit },
          td("unit", b.unit), terms.map((t) => td(t, fmtInt(b[t]), true)),
          td("conservation", fmtInt(lhs) + (lhs === rhs ? " = " : " ≠ ") + fmtInt(rhs), true));
      })));
    main.append(el("p", { class: "note" }, "Breaches: ", el("span", { "data-value": "breaches-g" + gen }, fmtInt(a.breaches)), "."));
    await statementsPanel(main, subject, route, region, a);
  }
  main.append(el("h2", {}, "USAGE_UNKNOWN reservations of this subject"));
  if (unknown.error) main.append(el("p", { class: "note" }, "Cannot list: " + unknown.error.message));
  else main.append(backlogTable(unknown, now, await resolverAnswers(unknown.reservations)));
  await subjectReservationsPanel(main, subject);
}

// statementsPanel shows one account's balance history: its epoch
// statements (the billing record, kept forever), latest first, and a chart
// of each unit's closing balances per epoch ending with the current
// account.
async function statementsPanel(main, subject, route, region, account) {
  const gen = n(account.policyGeneration);
  const resp = await console_("ListStatements", { subject, route, region, policyGeneration: gen, pageSize: 50 });
  const list = resp.statements || [];
  main.append(el("h3", {}, "Balance history of generation " + gen + " (epoch statements, latest first)"));
  main.append(el("p", { class: "note" }, el("span", { "data-value": "statements-g" + gen }, fmtInt(list.length)),
    " closed " + plural(list.length, "epoch") + (resp.nextPageToken ? " (the latest 50)" : "") + ". Each row is an epoch's closing balance; the chart ends with the account now."));
  for (const b of account.balances || []) {
    const series = new Series(["available", "reserved", "spent", "debt"]);
    for (const st of list.slice().reverse()) {
      const c = (st.closing || []).find((x) => x.unit === b.unit) || {};
      series.push(new Date(st.epochEnd).getTime() / 1000, { available: n(c.available), reserved: n(c.reserved), spent: n(c.spent), debt: n(c.debt) });
    }
    series.push(Date.now() / 1000, { available: n(b.available), reserved: n(b.reserved), spent: n(b.spent), debt: n(b.debt) });
    const box = el("div", {});
    main.append(box);
    chart(box, b.unit + " at each epoch close, then now (gen " + gen + ")", series, b.unit, "no epoch has closed yet: the chart starts at the first statement");
  }
  const rows = [];
  for (const st of list) {
    for (const c of st.closing || []) {
      rows.push(el("tr", { "data-key": "st/g" + gen + "/" + st.epochStart + "/" + c.unit },
        td("epochStart", fmtTime(st.epochStart)), td("epochEnd", fmtTime(st.epochEnd)), td("unit", c.unit),
        td("available", fmtInt(c.available), true), td("reserved", fmtInt(c.reserved), true), td("spent", fmtInt(c.spent), true),
        td("minted", fmtInt(c.minted), true), td("debt", fmtInt(c.debt), true)));
    }
  }
  main.append(table(["epoch start", "epoch end", "unit", { label: "available", num: true }, { label: "reserved", num: true },
    { label: "spent", num: true }, { label: "minted", num: true }, { label: "debt", num: true }], rows, "No epoch of this account has closed yet."));
}

// subjectReservationsPanel shows one subject's reservations: counts by
// route and state, and a page of them newest first, filtered by state.
async function subjectReservationsPanel(main, subject) {
  const filter = sessionStorage.getItem("capledger.stateFilter") || "";
  const tokens = state.reservationPages[subject] || [""];
  // A routes= token's page may come short or empty with a token (the
  // server reads a bounded number of rows per call): fullPage reads on to
  // fill it, and "older" starts after the last row read.
  const resp = await fullPage("ConsoleService", "ListSubjectReservations", {
    subject, states: filter ? [filter] : [], pageToken: tokens[tokens.length - 1],
  }, "reservations", 20);
  main.append(el("h2", {}, "Reservations of " + subject + " by state"));
  const counts = resp.counts || [];
  let total = 0;
  for (const c of counts) total += n(c.count);
  main.append(el("p", { class: "note" }, el("span", { "data-value": "reservations-total" }, fmtInt(total)),
    " kept " + plural(total, "reservation") + "; ", el("span", { "data-value": "retained" }, fmtInt(resp.retained)),
    " finished " + plural(resp.retained, "one was", "ones were") + " removed by retention (serve --retention): neither listed nor counted here."));
  main.append(table(["route", "state", { label: "count", num: true }],
    counts.map((c) => el("tr", { "data-key": "counts/" + c.route + "/" + stateName(c.state) },
      td("route", c.route), td("state", stateName(c.state)), td("count", fmtInt(c.count), true))), "No reservation kept."));
  const states = ["", "RESERVED", "STARTED", "SETTLED", "SETTLED_WITH_DEBT", "RELEASED", "EXPIRING", "EXPIRED", "USAGE_UNKNOWN"];
  const select = el("select", { id: "state-filter" }, states.map((s) =>
    el("option", { value: s ? "RESERVATION_STATE_" + s : "", selected: (s ? "RESERVATION_STATE_" + s : "") === filter }, s || "every state")));
  select.addEventListener("change", () => {
    sessionStorage.setItem("capledger.stateFilter", select.value);
    // The filter is every subject's, and a page token is bound to its
    // subject and filter: every subject's list starts again.
    state.reservationPages = {};
    render();
  });
  const pager = el("span", {},
    el("button", { id: "res-newer", disabled: tokens.length <= 1, onclick: () => { tokens.pop(); state.reservationPages[subject] = tokens; render(); } }, "newer"),
    el("button", { id: "res-older", disabled: !resp.nextPageToken, onclick: () => { state.reservationPages[subject] = tokens.concat([resp.nextPageToken]); render(); } }, "older"));
  main.append(el("div", { class: "filters" }, "state ", select, " page ", el("span", { "data-value": "res-page" }, String(tokens.length)), " ", pager));
  main.append(table(["reservation", "route", "gen", "state", "created", "held", "actual", "operation"],
    (resp.reservations || []).map((r) => el("tr", { "data-key": "res/" + r.reservationId },
      td("reservation", r.reservationId), td("route", r.route), td("generation", n(r.policyGeneration)), td("state", stateName(r.state)),
      td("created", fmtTime(r.createdAt)), td("held", units(r.reservedUnits)), td("actual", units(r.actualUnits)), td("operation", r.operationId || ""))),
    resp.nextPageToken ? "None in the rows read so far: older reads on." : "No reservation in this state."));
}

// resolverAnswers returns the resolver's last answer per reservation id
// for the listed reservations ({} when the server keeps none).
async function resolverAnswers(list) {
  const ids = (list || []).map((r) => r.reservationId);
  if (!ids.length) return {};
  const resp = await console_("GetResolverAnswers", { reservationIds: ids });
  return Object.fromEntries((resp.answers || []).map((a) => [a.reservationId, a]));
}

// reasonWords names the reasons of capacity rejections (API.md's error
// table: the three 429 reasons, and ACCOUNT_LIFETIME_EXHAUSTED, which a
// shadow policy counts as a would-be rejection) in words; the code itself
// is the cell's tooltip. A code not named here is shown as it is.
const reasonWords = {
  INSUFFICIENT_CAPACITY: "not enough capacity",
  ADMISSION_FROZEN: "frozen by debt",
  RESERVATION_TOO_LARGE: "estimate too large to ever fit",
  ACCOUNT_LIFETIME_EXHAUSTED: "account lifetime exhausted",
};
function reasonCell(reason) {
  const cell = td("reason", reasonWords[reason] || reason);
  cell.title = "reason: " + reason;
  cell.dataset.reason = reason;
  return cell;
}

// answerWords names the resolver's recorded answers (engine's
// OperationState names and Answer* codes) in words; the code itself is
// the cell's tooltip. A code not named here is shown as it is.
const answerWords = {
  running: "still running",
  finished: "finished",
  never_started: "never started",
  unknown: "the gateway does not know",
  error: "no verified answer",
  no_endpoint: "no operation-status endpoint configured for the route",
  settle_refused: "settle refused",
};
function answerCell(a) {
  if (!a) return td("answer", "not asked yet");
  const cell = td("answer", (answerWords[a.answer] || a.answer) + (a.detail ? ": " + a.detail : ""));
  cell.title = "resolver answer: " + a.answer;
  cell.dataset.answer = a.answer;
  return cell;
}

function backlogTable(resp, now, answers) {
  const overdue = new Set(resp.overdueReservationIds || []);
  return table(["reservation", "subject", "route", "gen", "operation", "marked unknown at", { label: "age", num: true }, "held", "overdue",
    "resolver's last answer", "asked at", { label: "attempts", num: true }, "next attempt"],
    (resp.reservations || []).map((r) => {
      const a = answers[r.reservationId];
      return el("tr", { "data-key": r.reservationId },
        td("reservation", r.reservationId), td("subject", tenantLink(r.subject, r.route, r.region)), td("route", r.route), td("generation", n(r.policyGeneration)),
        td("operation", r.operationId || ""), td("markedAt", fmtTime(r.usageUnknownAt)), td("age", fmtAge(r.usageUnknownAt, now), true),
        td("held", units(r.reservedUnits)), td("overdue", overdue.has(r.reservationId) ? "OVERDUE" : ""),
        answerCell(a), td("askedAt", a ? fmtTime(a.askedAt) : "—"),
        td("attempts", a ? fmtInt(a.attempts) : "0", true), td("nextAt", a ? fmtTime(a.nextAttemptAt) : "—"));
    }),
    "No USAGE_UNKNOWN reservation.");
}

pages.backlog = async function (main) {
  // The store-wide figures are absent both for a scoped token and when
  // they are zero (protojson leaves zeros out): the overview tells which.
  const [resp, ov] = await Promise.all([ledgerPage("ListUsageUnknown", {}, "reservations", 1000), console_("GetOverview")]);
  const now = Date.now();
  main.append(el("h1", {}, "USAGE_UNKNOWN backlog"));
  const shown = (resp.reservations || []).length;
  const cards = el("div", { class: "cards" }, card("listed", "Listed (your scope)", fmtInt(shown), resp.nextPageToken ? "first 1000" : ""));
  if (!ov.scoped) {
    cards.append(card("backlog", "Whole backlog", fmtInt(resp.backlog),
      resp.oldestUsageUnknownAt ? "oldest marked " + fmtAge(resp.oldestUsageUnknownAt, now) + " ago" : "nothing waiting"));
  }
  if (!resp.resolverConfigured) {
    // Without deadlines nothing is ever overdue: a 0 would say the
    // backlog is within them.
    cards.append(card("overdue", "Past unknownDeadline", "—", "this server runs no resolver (serve --resolver-config), so no deadline"));
  } else if (!ov.scoped && !resp.resolverScanned) {
    // Without a complete scan by this replica as worker leader the count
    // is not known (the metric is left out too): a 0 would say nothing
    // is overdue.
    cards.append(card("overdue", "Past unknownDeadline", "not scanned yet", "this replica's resolver has no complete scan of the backlog since it took the worker lease (only the lease holder scans, every --resolver-config interval)"));
  } else if (!ov.scoped) {
    cards.append(card("overdue", "Past unknownDeadline", fmtInt(resp.overdue), "at the resolver's last scan"));
  } else {
    // A scoped token gets no store-wide figures: count what is listed.
    cards.append(card("overdue", "Past unknownDeadline", fmtInt((resp.overdueReservationIds || []).length), "of those listed"));
  }
  main.append(cards);
  main.append(el("p", { class: "note" }, "Oldest first. Their capacity stays reserved until a settle with the operation id resolves them. " +
    "The resolver's last answer is what the worker leader heard from the route's operation-status endpoint (serve --resolver-config), read from the store."));
  main.append(backlogTable(resp, now, await resolverAnswers(resp.reservations)));
};

pages.debts = async function (main) {
  const [debts, standing] = await Promise.all([
    ledgerPage("ListDebts", {}, "accounts", 1000),
    // When refill repays each debt: the debtors' standings only (the
    // store's index of debtors, as ListDebts), not every account's.
    console_("ListAccountStandings", { inDebt: true, limit: 1000 }),
  ]);
  main.append(el("h1", {}, "Debts"));
  const repaid = {};
  for (const s of standing.accounts || []) {
    const a = s.account;
    repaid[a.subject + "/" + a.route + "@" + a.region + "#" + n(a.policyGeneration)] = s.dimensions || [];
  }
  const accounts = debts.accounts || [];
  main.append(el("div", { class: "cards" }, card("frozen", "Accounts frozen by debt", fmtInt(accounts.length), debts.nextPageToken ? "first page" : "", accounts.length ? "bad" : "ok")));
  main.append(el("p", { class: "note" }, "A settle used more than was reserved and available could not cover it: the route admits nothing for the subject until refill repays the debt."));
  const rows = [];
  for (const a of accounts) {
    const key = a.subject + "/" + a.route + "@" + a.region + "#" + n(a.policyGeneration);
    for (const b of a.balances || []) {
      if (!n(b.debt)) continue;
      const dim = (repaid[key] || []).find((d) => d.unit === b.unit);
      rows.push(el("tr", { "data-key": key + "/" + b.unit, class: "frozen" },
        td("subject", tenantLink(a.subject, a.route, a.region)), td("route", a.route), td("region", a.region), td("generation", n(a.policyGeneration)), td("unit", b.unit),
        td("debt", fmtInt(b.debt), true), td("issued", fmtInt(b.overdraftIssued), true), td("repaid", fmtInt(b.overdraftRepaid), true),
        td("breaches", fmtInt(a.breaches), true), td("repaidAt", dim ? repaidBy(dim) : "—")));
    }
  }
  main.append(table(["subject", "route", "region", "gen", "unit", { label: "debt", num: true }, { label: "overdraft issued", num: true },
    { label: "repaid", num: true }, { label: "breaches", num: true }, "repaid by refill at"], rows, "No account owes debt."));
};

pages.policies = async function (main) {
  // Rollouts and drain progress span tenants: the RolloutService refuses
  // them to a scoped token, so the page does not ask.
  // A page of 100 generations: ListPolicies pages (API.md), and with a
  // policy per tenant every generation is hundreds of thousands. A scoped
  // token's page may come short or empty with a token (the server reads a
  // bounded number of rows per call): fullPage reads on to fill it.
  const tokens = state.policyPages;
  const [resp, ov] = await Promise.all([
    fullPage("LedgerService", "ListPolicies", { pageToken: tokens[tokens.length - 1] }, "policies", POLICY_PAGE),
    console_("GetOverview")]);
  const scoped = !!ov.scoped;
  const policies = resp.policies || [];
  main.append(el("h1", {}, "Policies and generations"));
  if (scoped) main.append(el("h2", {}, "Rollouts"), el("p", { class: "note", "data-rollouts": "scoped" },
    "Rollouts and drain progress span tenants: a scoped token does not see them."));
  else await rolloutsPanel(main);
  main.append(el("h2", {}, "Generations"));
  main.append(el("p", { class: "note" }, "Every published generation, oldest first, with the rollout mode its reserves get now (enforce or shadow: " +
    "a staged rollout's on its route, with the generation's own beside it where they differ; the Tenants page shows the same). " +
    "For a rolled-back generation, the last column is what is left on its accounts until the drain reaches zero."));
  const pager = el("span", {},
    el("button", { id: "pol-prev", disabled: tokens.length <= 1, onclick: () => { tokens.pop(); render(); } }, "previous"),
    el("button", { id: "pol-next", disabled: !resp.nextPageToken, onclick: () => { tokens.push(resp.nextPageToken); render(); } }, "next"));
  main.append(el("div", { class: "filters" }, POLICY_PAGE + " generations a page, page ",
    el("span", { "data-value": "pol-page" }, String(tokens.length)), " ", pager));
  const drains = {};
  await Promise.all(policies.filter((p) => p.rolledBack).map(async (p) => {
    const st = await console_("ListAccountStandings", { policyGeneration: p.generation, limit: 1000 });
    let left = 0;
    for (const s of st.accounts || []) for (const b of s.account.balances || []) left += n(b.available) + n(b.reserved) + n(b.debt);
    drains[n(p.generation)] = { left, accounts: (st.accounts || []).length };
  }));
  main.append(table(["gen", "subject", "route", "region", "published", "mode now", "state", "dimensions", { label: "left to drain", num: true }],
    policies.map((p) => {
      const gen = n(p.generation);
      const d = drains[gen];
      return el("tr", { "data-key": "g" + gen },
        td("generation", gen), td("subject", p.subject), td("route", p.route), td("region", p.region), td("published", fmtTime(p.publishedAt)),
        td("mode", modeShown(p.active ? p.rolloutNow : p.rollout, p.rollout)), td("state", p.rolledBack ? "rolled back" : p.active ? "active" : "superseded"),
        td("dimensions", (p.dimensions || []).map((x) => x.unit + ": burst " + fmtInt(x.burst) + ", +" + fmtInt(x.refillUnits) + "/" + (x.refillInterval || "—")).join("; ")),
        td("drain", d ? fmtInt(d.left) + " on " + fmtInt(d.accounts) + " " + plural(d.accounts, "account") : "", true));
    }), "No policy published."));
  const rolledBack = policies.filter((p) => p.rolledBack).map((p) => n(p.generation));
  if (rolledBack.length && !scoped) await drainPanel(main, rolledBack);
};

// rolloutsPanel shows the staged rollouts (RolloutService): routes and
// their mode, the enforced share ("ended" for an ended rollout, which
// enforces nothing) and the last step, who and when.
async function rolloutsPanel(main) {
  main.append(el("h2", {}, "Rollouts"));
  let resp;
  try { resp = await rollouts("ListRollouts"); } catch (err) {
    if (err.status === 403) { main.append(el("p", { class: "note", "data-rollouts": "refused" }, "Rollouts span tenants: a scoped token does not see them.")); return; }
    if (err.code === "unimplemented") { main.append(el("p", { class: "note" }, "This server keeps no rollouts.")); return; }
    throw err;
  }
  const list = resp.rollouts || [];
  main.append(table(["rollout", "hash by", { label: "enforced", num: true }, "routes (mode now)", { label: "version", num: true }, "last step", "by", "at", { label: "steps", num: true }],
    list.map((r) => {
      const steps = r.steps || [];
      const last = steps[steps.length - 1] || {};
      return el("tr", { "data-key": "rollout/" + r.name },
        td("name", r.name), td("hashBy", r.hashBy), td("percent", r.ended ? "ended" : n(r.percent).toFixed(2) + "%", true),
        td("routes", (r.routes || []).map((x) => x.route + "@" + (x.region || "global") + " " + routeMode(r, x)).join(", ")),
        td("version", fmtInt(r.version), true),
        td("step", last.action ? last.action + " " + n(last.priorPercent).toFixed(2) + "% → " + n(last.percent).toFixed(2) + "%" : "—"),
        td("who", last.who || "—"), td("at", fmtTime(last.at)), td("steps", fmtInt(steps.length), true));
    }), "No staged rollout."));
}

// routeMode is a rollout route's mode now. Hashed by subject, "enforce"
// is the mode of the share of subjects hashed into it (API.md), not of the
// route's every request: the Generations table says "per subject" of them.
const routeMode = (r, x) => (r.hashBy === "subject" && x.mode === "enforce" && !r.ended
  ? "enforce for " + n(r.percent).toFixed(2) + "% of subjects" : x.mode);

// blockedText says how many of a drain's accounts cannot move what they
// hold, as `capledger rollback`'s BLOCKED column does: the dropped-unit
// count (capacity or debt in a unit the deciding generation does not
// limit) only when there are some.
const blockedText = (d) => {
  if (!(n(d.blockedByBurst) + n(d.blockedNoPolicy) + n(d.blockedDroppedUnit))) return "—";
  const text = fmtInt(d.blockedByBurst) + " at burst, " + fmtInt(d.blockedNoPolicy) + " without a policy";
  return n(d.blockedDroppedUnit) ? text + ", " + fmtInt(d.blockedDroppedUnit) + " in a dropped unit" : text;
};

// drainPanel shows what rolled-back generations still hold
// (RolloutService.DrainProgress), until they are drained.
async function drainPanel(main, generations) {
  main.append(el("h2", {}, "Drain progress of rolled-back generations"));
  let resp;
  try { resp = await rollouts("DrainProgress", { generations }); } catch (err) {
    main.append(el("p", { class: "note" }, "Cannot read the drain progress: " + err.message)); return;
  }
  main.append(table(["gen", "subject", "route", { label: "accounts", num: true }, "reserved", "debt", "available", { label: "unreconciled shards", num: true }, "blocked", "drained"],
    (resp.generations || []).map((d) => el("tr", { "data-key": "drain/g" + n(d.generation) },
      td("generation", n(d.generation)), td("subject", d.subject), td("route", d.route), td("accounts", fmtInt(d.accounts), true),
      td("reserved", units(d.reserved)), td("debt", units(d.debt)), td("available", units(d.available)),
      td("shards", fmtInt(d.unreconciledShards), true),
      td("blocked", blockedText(d)),
      td("drained", d.drained ? "yes" : "no"))), "Nothing to drain."));
  // When the pass that read these accounts and shards began: one pass is
  // shared and given again for a while, as the Fairness page says of its own.
  if (resp.asOf) main.append(el("p", { class: "note" }, "Accounts and shards read at ",
    el("span", { "data-value": "drainAsOf" }, fmtTime(resp.asOf)), " (one pass over the generation's accounts is shared and given again for a while: API.md)."));
}

pages.shards = async function (main) {
  let resp;
  try { resp = await shards("ListShards"); } catch (err) {
    if (err.code === "unimplemented" || err.status === 404) { main.append(el("h1", {}, "Shards"), el("p", { class: "empty" }, "This server issues no emergency shards.")); return; }
    throw err;
  }
  const list = resp.shards || [];
  const now = Date.now();
  const soon = now + 10 * 60 * 1000;
  let live = 0, expiring = 0, expired = 0, reconciled = 0, refused = 0, invalid = 0;
  for (const s of list) {
    const exp = new Date(s.expiresAt).getTime();
    if (s.reconciled) reconciled++;
    else if (exp <= now) expired++;
    else { live++; if (exp <= soon) expiring++; }
    refused += n(s.refusedSubmissions);
    if (!s.signatureValid) invalid++;
  }
  main.append(el("h1", {}, "Emergency shards"));
  main.append(el("div", { class: "cards" },
    card("issued", "Issued", fmtInt(list.length)), card("live", "Live", fmtInt(live), fmtInt(expiring) + " " + plural(expiring, "expires", "expire") + " within 10 min"),
    card("expired", "Expired, not reconciled", fmtInt(expired), "", expired ? "warn" : ""), card("reconciled", "Reconciled", fmtInt(reconciled)),
    card("refused", "Refused submissions", fmtInt(refused), "", refused ? "warn" : ""), card("invalid", "Signature no longer valid", fmtInt(invalid))));
  main.append(table(["shard", "subject", "route", "gen", "gateway", "fence", "allocated", "issued", "expires", "reconciled", "spent", "unknown", "reminted"],
    list.map((s) => el("tr", { "data-key": s.shardId },
      td("shard", s.shardId), td("subject", s.subject), td("route", s.route), td("generation", n(s.policyGeneration)), td("gateway", s.gatewayId + " (boot " + n(s.bootEpoch) + ")"),
      td("fence", n(s.fence), true), td("allocated", units(s.allocatedUnits)), td("issued", fmtTime(s.issuedAt)), td("expires", fmtTime(s.expiresAt)),
      td("reconciled", s.reconciled ? "yes" : "no"), td("spent", units(s.spentUnits)), td("unknown", units(s.unknownUnits)), td("reminted", units(s.remintedUnits)))),
    "No shard issued."));
  main.append(el("p", { class: "note" }, "Audit discrepancies of shard conservation show here after an admin runs the audit from the overview."));
  if (state.lastAudit) main.append(auditTable(state.lastAudit, "shard_conservation"));
};

pages.fairness = async function (main) {
  const [resp, ov] = await Promise.all([console_("GetFairness"), console_("GetOverview")]);
  main.append(el("h1", {}, "Fairness"));
  if (ov.scoped) {
    // GetFairness counts only the scope's accounts: the group, its total
    // and every share are those of your tenants, not of the route's.
    main.append(el("p", { class: "note", "data-scoped": "fairness" },
      "Your token is scoped to some tenants: each group, its total spent and every share here are among your tenants' accounts only, not every tenant's on the route."));
  }
  main.append(el("p", { class: "note" }, "Per route and unit: each subject's spent units against its weighted share of what the group spent, " +
    "e_i = |served − fair| / fair, against the policy's budget. This is the ledger's lifetime view of the active accounts, with shares by weight regardless of demand; " +
    "a tenant that asks less than its share shows a large e_i without being treated unfairly. The scheduler's exact window figure (docs/FAIRNESS.md) lives in the gateway."));
  const groups = resp.groups || [];
  main.append(el("p", { class: "note" }, "Each group lists at most the 20 subjects farthest from their fair share (the largest e_i first) and counts every subject; accounts read at ",
    el("span", { "data-value": "asOf" }, fmtTime(resp.asOf)), " (one computation over every account is shared and given again for a while: API.md)."));
  if (!groups.length) main.append(el("p", { class: "empty" }, "No account yet."));
  for (const g of groups) {
    const listed = (g.subjects || []).length;
    main.append(el("h2", {}, g.route + " @ " + g.region + " — " + g.unit + " (" + fmtInt(g.totalSpent) + " spent)"));
    main.append(el("p", { class: "note", "data-group": g.route + "@" + g.region + "/" + g.unit },
      el("span", { "data-value": "subjectCount" }, fmtInt(g.subjectCount)), " " + plural(n(g.subjectCount), "subject", "subjects") + ", ",
      el("span", { "data-value": "outsideBudget" }, fmtInt(g.outsideBudget)), " outside budget; showing the " + fmtInt(listed) + " farthest from their fair share."));
    main.append(table(["subject", "gen", { label: "weight", num: true }, { label: "spent", num: true }, { label: "served", num: true },
      { label: "fair share", num: true }, { label: "e_i", num: true }, { label: "budget", num: true }, "within"],
    (g.subjects || []).map((s) => el("tr", { "data-key": g.route + "@" + g.region + "/" + g.unit + "/" + s.subject },
      td("subject", s.subject), td("generation", n(s.policyGeneration)), td("weight", fmtInt(s.weight), true), td("spent", fmtInt(s.spent), true),
      td("served", fmtPct(n(s.servedShare)), true), td("fair", fmtPct(n(s.fairShare)), true), td("error", fmtDec(s.error, 3), true),
      td("budget", fmtDec(s.budget, 3), true), td("within", s.withinBudget ? "yes" : "NO")))));
  }
};

// ---- router ------------------------------------------------------------

// render draws the page of the location's hash. The refresh timer calls
// it with {refresh: true}; every other call is the operator's action
// (navigation, a submitted form, a token).
async function render(opts) {
  const refresh = !!(opts && opts.refresh === true);
  clearTimeout(state.timer);
  const route = location.hash.replace(/^#/, "") || "overview";
  const [name, ...args] = route.split("/");
  const page = pages[name] ? name : "overview";
  const seq = ++state.seq;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("current", a.getAttribute("href") === "#" + page);
  const fresh = el("main", { id: "main", "data-page": page, "data-route": route });
  let failure = null;
  try {
    await pages[page](fresh, args);
    fresh.setAttribute("data-read-at", new Date().toISOString());
  } catch (err) {
    failure = err;
  }
  if (seq !== state.seq) return; // a newer render (hash change, token) took over
  const old = document.getElementById("main");
  const sameRoute = old.getAttribute("data-route") === route;
  if (failure && failure.code === "unreachable" && sameRoute && old.hasAttribute("data-read-at")) {
    // The server is out of reach: keep the last data of this page, marked
    // stale, rather than a blank page; the next refresh tries again.
    showError(failure, old.getAttribute("data-read-at"));
    old.setAttribute("data-failed", failure.code);
    old.setAttribute("data-ready", page);
  } else {
    showError(failure);
    fresh.setAttribute("data-ready", page);
    if (failure) fresh.setAttribute("data-failed", failure.code || String(failure.status || "error"));
    // A refresh of the same page keeps what the operator is typing in a
    // search box: an input whose value differs from the one it was drawn
    // with. A submitted search (Enter) is shown at once, and the focus
    // stays where it was.
    const active = document.activeElement;
    const focused = active && active !== document.body && old.contains(active) && sameRoute ? active : null;
    const typing = refresh && focused && focused.tagName === "INPUT" && focused.value !== focused.defaultValue;
    if (!typing) {
      const scrolled = sameRoute ? [...old.querySelectorAll(".table-wrap")].map((w) => w.scrollLeft) : [];
      old.replaceWith(fresh);
      keepSidewaysScroll(scrolled, fresh);
      markScrollHints(fresh);
      keepFocus(focused, fresh);
    }
  }
  state.timer = setTimeout(() => render({ refresh: true }), REFRESH_MS);
}

// keepSidewaysScroll scrolls each wide table of a redrawn page as far
// sideways as its counterpart (the same place among the page's tables) was,
// so a refresh every 5 s does not throw the operator back to the first
// columns. Only a redraw of the same route keeps them.
function keepSidewaysScroll(scrolled, fresh) {
  fresh.querySelectorAll(".table-wrap").forEach((wrap, i) => { if (scrolled[i]) wrap.scrollLeft = scrolled[i]; });
}

// keepFocus moves the focus from an element of the replaced page to its
// counterpart (the same id) in the new one, so a refresh every 5 s does
// not throw a keyboard user back to the top of the page.
// A link without an id is found by its href (the same one of several).
function keepFocus(focused, fresh) {
  if (!focused) return;
  let twin = null;
  if (focused.id) twin = fresh.querySelector("#" + CSS.escape(focused.id));
  else if (focused.tagName === "A" && focused.hasAttribute("href")) {
    const sel = 'a[href="' + CSS.escape(focused.getAttribute("href")) + '"]';
    const i = [...focused.closest("main").querySelectorAll(sel)].indexOf(focused);
    twin = fresh.querySelectorAll(sel)[i] || null;
  }
  if (!twin) return;
  twin.focus({ preventScroll: true });
  if (twin.tagName === "INPUT" && twin.type === "text" && focused.selectionStart !== null) {
    twin.setSelectionRange(focused.selectionStart, focused.selectionEnd);
  }
}

document.getElementById("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const input = document.getElementById("token");
  if (input.value.trim()) sessionStorage.setItem(TOKEN_KEY, input.value.trim());
  input.value = "";
  state.prevOverview = null;
  tokenChanged();
});
document.getElementById("token-forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  state.prevOverview = null; state.lastAudit = null;
  tokenChanged();
});

// tokenChanged renders the page for the new token (or none). What the
// old token read is never kept as stale data, also when the server is out
// of reach.
function tokenChanged() {
  state.auditError = null;
  // A page token is bound to the token it was issued to: every list
  // starts again.
  state.policyPages = [""];
  state.reservationPages = {};
  document.getElementById("main").removeAttribute("data-read-at");
  tokenState();
  render();
}
window.addEventListener("hashchange", render);
window.addEventListener("resize", () => markScrollHints(document));
tokenState();
render();
