// sluice demo page: simulated clients call GET /api/hello; every response is
// logged, plotted and its headers shown. No framework, no build step.
"use strict";

// The simulated clients. The anonymous ones send X-Forwarded-For, which the
// demo server reads from loopback peers only (see its package doc).
const CLIENTS = [
  { id: "free", name: "Free tenant", color: "#2563eb", plan: "free",
    who: "tenant acme", header: "X-API-Key: demo-free", headers: { "X-API-Key": "demo-free" } },
  { id: "pro", name: "Pro tenant", color: "#059669", plan: "pro",
    who: "tenant globex", header: "X-API-Key: demo-pro", headers: { "X-API-Key": "demo-pro" } },
  { id: "anon-a", name: "Anonymous A", color: "#d97706", plan: "anonymous",
    who: "no API key: limited by address", header: "X-Forwarded-For: 203.0.113.7", headers: { "X-Forwarded-For": "203.0.113.7" } },
  { id: "anon-b", name: "Anonymous B", color: "#c026d3", plan: "anonymous",
    who: "no API key: limited by address", header: "X-Forwarded-For: 198.51.100.23", headers: { "X-Forwarded-For": "198.51.100.23" } },
];

const BURST = 20;         // requests a burst fires at once
const MAX_ROWS = 400;     // log rows kept; older ones are dropped
const MAX_POINTS = 2000;  // chart points kept per client
const RL_HEADERS = new Set(["ratelimit", "ratelimit-policy", "retry-after",
  "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"]);
// The algorithms whose tokens refill continuously, for the chart's estimate.
const CONTINUOUS = new Set(["TokenBucket", "GCRA", "LeakyBucket"]);

const $ = (sel, root = document) => root.querySelector(sel);

const state = {
  plans: new Map(),  // name → plan as GET /api/plans gives it
  clients: new Map(), // id → { def, card, points, allowed, denied, policy, limit }
  ok: 0,
  denied: 0,
  other: 0,
};

// ---- Setup ---------------------------------------------------------------

function init() {
  const template = $("#client-template");
  for (const def of CLIENTS) {
    const card = template.content.firstElementChild.cloneNode(true);
    card.dataset.client = def.id;
    card.style.setProperty("--color", def.color);
    card.setAttribute("aria-labelledby", "client-" + def.id);
    $(".client-name", card).id = "client-" + def.id;
    $(".client-name", card).textContent = def.name;
    $(".client-who", card).textContent = def.who;
    $(".client-header code", card).textContent = def.header;
    for (const button of card.querySelectorAll("button")) {
      // The name starts with the visible text, as speech input expects.
      button.dataset.client = def.id;
      button.setAttribute("aria-label", `${button.textContent}: ${def.name}`);
    }
    $('[data-action="one"]', card).addEventListener("click", () => sendOne(def.id));
    $('[data-action="burst"]', card).addEventListener("click", () => burst(def.id));
    $("#clients").append(card);
    state.clients.set(def.id, { def, card, points: [], allowed: 0, denied: 0, policy: null, limit: null });

    const item = document.createElement("li");
    item.append(swatch(def.color), def.name);
    $("#legend").append(item);
  }
  $("#clear").addEventListener("click", clearAll);
  $("#plan-name").addEventListener("change", () => fillForm($("#plan-name").value));
  $("#plan-form").addEventListener("submit", submitPlan);
  new ResizeObserver(drawChart).observe($(".chart-box"));
  setInterval(() => { if (totalPoints() > 0) drawChart(); }, 250);
  loadPlans();
  drawChart();
}

async function loadPlans() {
  try {
    const res = await fetch("/api/plans", { cache: "no-store" });
    if (!res.ok) throw new Error(`GET /api/plans: ${res.status}`);
    const data = await res.json();
    $("#store-kind").textContent = data.store;
    const algorithm = $("#plan-algorithm");
    algorithm.replaceChildren(...data.algorithms.map((a) => new Option(a, a)));
    const name = $("#plan-name");
    name.replaceChildren(...data.plans.map((p) => new Option(`${p.name} (${p.subject})`, p.name)));
    for (const p of data.plans) state.plans.set(p.name, p);
    fillForm(data.plans[0].name);
    renderPlans();
  } catch (err) {
    $("#summary").textContent = "Could not load the plans: " + err.message;
  }
}

// ---- Requests ------------------------------------------------------------

// send makes one request as client id and records its outcome.
async function send(id) {
  const c = state.clients.get(id);
  const started = performance.now();
  let outcome;
  try {
    const res = await fetch("/api/hello", { headers: c.def.headers, cache: "no-store" });
    const body = await res.text();
    outcome = { status: res.status, statusText: res.statusText, headers: [...res.headers], body };
  } catch (err) {
    outcome = { status: 0, statusText: "network error", headers: [], body: String(err) };
  }
  outcome.ms = performance.now() - started;
  outcome.at = new Date();
  outcome.client = c;
  const h = new Map(outcome.headers);
  outcome.remaining = intOrNull(h.get("x-ratelimit-remaining"));
  outcome.limit = intOrNull(h.get("x-ratelimit-limit"));
  outcome.retryAfter = h.get("retry-after") ?? null;
  outcome.policy = h.get("ratelimit-policy") ?? null;
  outcome.rateLimit = h.get("ratelimit") ?? null;
  record(outcome);
  return outcome;
}

async function sendOne(id) {
  const o = await send(id);
  say(`${o.client.def.name}: ${o.status} ${o.statusText}` +
    (o.remaining !== null ? `, ${o.remaining} left` : "") +
    (o.retryAfter !== null ? `, retry after ${o.retryAfter} s` : "") + ".");
}

// burst fires BURST requests at once as client id (the browser sends up to
// six at a time on one HTTP/1.1 origin; the rest queue behind them).
async function burst(id) {
  const c = state.clients.get(id);
  const buttons = c.card.querySelectorAll("button");
  buttons.forEach((b) => { b.disabled = true; });
  const started = performance.now();
  const outcomes = await Promise.all(Array.from({ length: BURST }, () => send(id)));
  buttons.forEach((b) => { b.disabled = false; });
  const ok = outcomes.filter((o) => o.status === 200).length;
  const denied = outcomes.filter((o) => o.status === 429).length;
  const rest = outcomes.length - ok - denied;
  say(`${c.def.name}: burst of ${BURST} in ${Math.round(performance.now() - started)} ms: ` +
    `${ok} allowed, ${denied} denied` + (rest ? `, ${rest} other` : "") + ".");
}

function say(text) { $("#summary").textContent = text; }

function intOrNull(v) {
  if (v === undefined || v === null || !/^\d+$/.test(v)) return null;
  return Number(v);
}

// ---- Outcomes --------------------------------------------------------------

function record(o) {
  const c = o.client;
  if (o.status === 200) { c.allowed++; state.ok++; } else if (o.status === 429) { c.denied++; state.denied++; } else { state.other++; }
  if (o.remaining !== null) {
    c.points.push({ t: o.at.getTime(), remaining: o.remaining, allowed: o.status === 200 });
    if (c.points.length > MAX_POINTS) c.points.shift();
  }
  if (o.limit !== null) c.limit = o.limit;
  updateCard(c, o);
  addRow(o);
  showLast(o);
  updateCounts();
  drawChart();
}

function updateCard(c, o) {
  const card = c.card;
  if (o.remaining !== null) {
    $(".remaining", card).textContent = o.remaining;
    $(".of", card).textContent = o.limit !== null ? ` / ${o.limit}` : "";
    const pct = o.limit ? Math.min(100, (100 * o.remaining) / o.limit) : 0;
    $(".fill", card).style.width = pct + "%";
    card.dataset.remaining = o.remaining;
  }
  if (o.policy !== null) {
    const p = $(".client-policy", card);
    if (c.policy !== null && c.policy !== o.policy) {
      p.classList.add("changed");
      p.title = `RateLimit-Policy changed from ${c.policy}`;
    } else if (c.policy === o.policy) {
      p.classList.remove("changed");
      p.removeAttribute("title");
    }
    c.policy = o.policy;
    $(".policy", card).textContent = "RateLimit-Policy: " + o.policy;
  }
  $(".allowed", card).textContent = c.allowed;
  $(".denied", card).textContent = c.denied;
  card.dataset.allowed = c.allowed;
  card.dataset.denied = c.denied;
}

function addRow(o) {
  const tr = document.createElement("tr");
  tr.className = `outcome status-${o.status || "error"} fresh`;
  tr.dataset.client = o.client.def.id;
  tr.dataset.status = o.status;
  const badge = o.status === 200 ? "ok" : o.status === 429 ? "denied" : "other";
  tr.innerHTML =
    `<td>${clock(o.at)}</td>` +
    `<td><span class="who"></span></td>` +
    `<td><span class="badge ${badge}"></span></td>` +
    `<td>${o.remaining !== null ? o.remaining + (o.limit !== null ? " / " + o.limit : "") : "—"}</td>` +
    `<td>${o.retryAfter !== null ? escapeHTML(o.retryAfter) + " s" : "—"}</td>` +
    `<td class="rl"></td>`;
  $(".who", tr).append(swatch(o.client.def.color), o.client.def.name);
  $(".badge", tr).textContent = o.status || "error";
  $(".rl", tr).textContent = o.rateLimit ?? "—";
  tr.addEventListener("animationend", () => tr.classList.remove("fresh"), { once: true });
  const body = $("#log-body");
  body.prepend(tr);
  while (body.rows.length > MAX_ROWS) body.deleteRow(-1);
  $("#log").dataset.rows = body.rows.length;
}

function updateCounts() {
  $("#count-ok").textContent = `${state.ok} × 200`;
  $("#count-denied").textContent = `${state.denied} × 429`;
  const log = $("#log");
  log.dataset.ok = state.ok;
  log.dataset.denied = state.denied;
}

function showLast(o) {
  $("#last-meta").textContent =
    `${o.client.def.name} · GET /api/hello · ${clock(o.at)} · ${Math.round(o.ms)} ms`;
  const pre = $("#last-headers");
  pre.replaceChildren();
  const status = document.createElement("span");
  status.className = "status-line";
  status.textContent = `HTTP ${o.status} ${o.statusText}`;
  pre.append(status, "\n");
  for (const [name, value] of o.headers) {
    const line = document.createElement("span");
    if (RL_HEADERS.has(name)) line.className = "rl-header";
    line.textContent = `${name}: ${value}`;
    pre.append(line, "\n");
  }
  pre.dataset.status = o.status;
  $("#last-body").textContent = o.body.trimEnd();
}

function clearAll() {
  for (const c of state.clients.values()) {
    c.points = [];
    c.allowed = c.denied = 0;
    c.policy = null;
    c.limit = null;
    const card = c.card;
    $(".remaining", card).textContent = "–";
    $(".of", card).textContent = "";
    $(".fill", card).style.width = "0";
    $(".policy", card).textContent = "no response yet";
    $(".client-policy", card).classList.remove("changed");
    $(".allowed", card).textContent = "0";
    $(".denied", card).textContent = "0";
    delete card.dataset.remaining;
    card.dataset.allowed = card.dataset.denied = 0;
  }
  state.ok = state.denied = state.other = 0;
  $("#log-body").replaceChildren();
  $("#log").dataset.rows = 0;
  updateCounts();
  $("#last-meta").textContent = "None yet.";
  $("#last-headers").replaceChildren();
  $("#last-body").textContent = "";
  say("Cleared. The buckets on the server keep their tokens.");
  drawChart();
}

// ---- Chart -----------------------------------------------------------------

function totalPoints() {
  let n = 0;
  for (const c of state.clients.values()) n += c.points.length;
  return n;
}

// refillPerMs is the plan's refill rate, for the estimated tail; null for
// the window algorithms, which do not refill continuously.
function refillPerMs(planName) {
  const p = state.plans.get(planName);
  if (!p || !CONTINUOUS.has(p.algorithm)) return null;
  const ms = durationMs(p.refill_period);
  return ms > 0 ? p.refill_tokens / ms : null;
}

// durationMs reads a Go duration string ("1m30s", "250ms", "1.5s").
function durationMs(s) {
  const units = { h: 3600e3, m: 60e3, s: 1e3, ms: 1, us: 1e-3, "µs": 1e-3, ns: 1e-6 };
  let total = 0;
  const re = /(\d+(?:\.\d+)?)(h|ms|us|µs|ns|m|s)/g;
  let m;
  while ((m = re.exec(s)) !== null) total += parseFloat(m[1]) * units[m[2]];
  return total;
}

// niceStep is a round step (1, 2 or 5 times a power of ten, at least 1)
// that divides 0..v into about five ticks.
function niceStep(v) {
  const raw = Math.max(1, v / 5);
  const mag = 10 ** Math.floor(Math.log10(raw));
  for (const f of [1, 2, 5, 10]) if (f * mag >= raw) return f * mag;
  return 10 * mag;
}

function drawChart() {
  const canvas = $("#chart");
  const box = canvas.getBoundingClientRect();
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(1, Math.round(box.width * dpr));
  const h = Math.max(1, Math.round(box.height * dpr));
  if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  const W = box.width, H = box.height;
  ctx.clearRect(0, 0, W, H);

  const style = getComputedStyle(document.documentElement);
  const ink = style.getPropertyValue("--muted").trim() || "#5b6478";
  const grid = style.getPropertyValue("--line").trim() || "#dfe3ec";
  const font = getComputedStyle(document.body).fontFamily;
  const pad = { left: 46, right: 18, top: 14, bottom: 30 };
  const pw = W - pad.left - pad.right, ph = H - pad.top - pad.bottom;

  const now = Date.now();
  let first = now;
  let top = 0;
  for (const c of state.clients.values()) {
    if (c.points.length) first = Math.min(first, c.points[0].t);
    if (c.limit !== null) top = Math.max(top, c.limit);
    for (const p of c.points) top = Math.max(top, p.remaining);
  }
  const span = Math.min(60e3, Math.max(10e3, now - first + 2e3));
  const t0 = now - span;
  const yStep = niceStep(Math.max(top, 5));
  const yMax = Math.ceil(Math.max(top, 5) / yStep) * yStep;
  const x = (t) => pad.left + ((t - t0) / span) * pw;
  const y = (v) => pad.top + ph - (v / yMax) * ph;

  // Grid and axes.
  ctx.font = `12px ${font}`;
  ctx.lineWidth = 1;
  ctx.strokeStyle = grid;
  ctx.fillStyle = ink;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let v = 0; v <= yMax; v += yStep) {
    const yy = Math.round(y(v)) + 0.5;
    ctx.beginPath(); ctx.moveTo(pad.left, yy); ctx.lineTo(W - pad.right, yy); ctx.stroke();
    ctx.fillText(String(v), pad.left - 8, yy);
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (let s = 0; s * 1e3 <= span; s += span > 30e3 ? 10 : 5) {
    const xx = Math.round(x(now - s * 1e3)) + 0.5;
    ctx.beginPath(); ctx.moveTo(xx, pad.top + ph); ctx.lineTo(xx, pad.top + ph + 4); ctx.stroke();
    ctx.fillText(s === 0 ? "now" : `−${s} s`, xx, pad.top + ph + 8);
  }

  if (totalPoints() === 0) {
    ctx.textBaseline = "middle";
    ctx.fillText("Send a request to start the chart", pad.left + pw / 2, pad.top + ph / 2);
    canvas.dataset.points = 0;
    return;
  }

  ctx.save();
  ctx.beginPath();
  ctx.rect(pad.left, pad.top - 6, pw + 6, ph + 12);
  ctx.clip();
  for (const c of state.clients.values()) {
    if (!c.points.length) continue;
    ctx.strokeStyle = c.def.color;
    ctx.fillStyle = c.def.color;
    ctx.lineWidth = 2;
    ctx.lineJoin = "round";
    ctx.setLineDash([]);
    ctx.beginPath();
    c.points.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p.remaining)) : ctx.moveTo(x(p.t), y(p.remaining))));
    ctx.stroke();
    drawTail(ctx, c, now, x, y);
    for (const p of c.points) drawMarker(ctx, x(p.t), y(p.remaining), p.allowed);
  }
  ctx.restore();

  canvas.dataset.points = totalPoints();
  for (const c of state.clients.values()) canvas.setAttribute("data-points-" + c.def.id, c.points.length);
}

// drawTail draws the estimated refill from the client's last point to now.
function drawTail(ctx, c, now, x, y) {
  const rate = refillPerMs(c.def.plan);
  const last = c.points[c.points.length - 1];
  if (rate === null || c.limit === null) return;
  const full = last.t + Math.max(0, c.limit - last.remaining) / rate;
  ctx.setLineDash([5, 4]);
  ctx.globalAlpha = 0.7;
  ctx.beginPath();
  ctx.moveTo(x(last.t), y(last.remaining));
  if (full < now) {
    ctx.lineTo(x(full), y(c.limit));
    ctx.lineTo(x(now), y(c.limit));
  } else {
    ctx.lineTo(x(now), y(last.remaining + (now - last.t) * rate));
  }
  ctx.stroke();
  ctx.globalAlpha = 1;
  ctx.setLineDash([]);
}

function drawMarker(ctx, px, py, allowed) {
  if (allowed) {
    ctx.beginPath();
    ctx.arc(px, py, 3, 0, 2 * Math.PI);
    ctx.fill();
    return;
  }
  ctx.lineWidth = 2;
  ctx.beginPath();
  ctx.moveTo(px - 4, py - 4); ctx.lineTo(px + 4, py + 4);
  ctx.moveTo(px + 4, py - 4); ctx.lineTo(px - 4, py + 4);
  ctx.stroke();
}

// ---- Plans -----------------------------------------------------------------

function describe(p) {
  return `${p.algorithm} · ${p.capacity} tokens, +${p.refill_tokens} per ${p.refill_period}`;
}

function renderPlans(updated) {
  const rows = [];
  for (const p of state.plans.values()) {
    const tr = document.createElement("tr");
    tr.dataset.plan = p.name;
    tr.dataset.revision = p.revision;
    if (p.name === updated) {
      tr.className = "updated";
      tr.addEventListener("animationend", () => tr.classList.remove("updated"), { once: true });
    }
    for (const v of [p.name, p.revision, p.algorithm, p.capacity, `+${p.refill_tokens} per ${p.refill_period}`]) {
      const td = document.createElement("td");
      td.textContent = v;
      tr.append(td);
    }
    rows.push(tr);
  }
  $("#plans-body").replaceChildren(...rows);
  for (const c of state.clients.values()) {
    const p = state.plans.get(c.def.plan);
    if (!p) continue;
    const line = $(".client-plan", c.card);
    line.innerHTML = `Plan <strong></strong> <span class="revision"></span><br><span class="limits"></span>`;
    $("strong", line).textContent = p.name;
    $(".revision", line).textContent = "revision " + p.revision;
    $(".limits", line).textContent = describe(p);
  }
}

function fillForm(name) {
  const p = state.plans.get(name);
  if (!p) return;
  $("#plan-name").value = p.name;
  $("#plan-algorithm").value = p.algorithm;
  $("#plan-capacity").value = p.capacity;
  $("#plan-refill-tokens").value = p.refill_tokens;
  $("#plan-refill-period").value = p.refill_period;
  clearErrors();
}

const FIELD_INPUTS = {
  algorithm: "#plan-algorithm",
  capacity: "#plan-capacity",
  refill_tokens: "#plan-refill-tokens",
  refill_period: "#plan-refill-period",
};

function clearErrors() {
  for (const [field, sel] of Object.entries(FIELD_INPUTS)) {
    $(sel).removeAttribute("aria-invalid");
    $(`#plan-${field}-error`).textContent = "";
  }
}

// number sends a numeric field as typed: a whole number as a JSON number,
// anything else as it is, for the server to reject by name.
function number(v) {
  v = v.trim();
  if (v === "") return undefined;
  return /^-?\d+$/.test(v) ? Number(v) : v;
}

async function submitPlan(event) {
  event.preventDefault();
  clearErrors();
  const name = $("#plan-name").value;
  const status = $("#plan-status");
  const submit = $("#plan-submit");
  const body = {
    algorithm: $("#plan-algorithm").value,
    capacity: number($("#plan-capacity").value),
    refill_tokens: number($("#plan-refill-tokens").value),
    refill_period: $("#plan-refill-period").value.trim() || undefined,
  };
  submit.disabled = true;
  status.className = "plan-status";
  status.textContent = "Applying…";
  try {
    const res = await fetch("/api/plans/" + encodeURIComponent(name), {
      method: "PUT",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    const data = await res.json();
    if (!res.ok) {
      for (const e of data.errors ?? []) {
        const sel = FIELD_INPUTS[e.field];
        if (!sel) continue;
        $(sel).setAttribute("aria-invalid", "true");
        $(`#plan-${e.field}-error`).textContent = e.message;
      }
      status.className = "plan-status failed";
      status.dataset.state = "failed";
      status.textContent = `Not applied (${res.status}): ${data.error}`;
      return;
    }
    state.plans.set(data.name, data);
    renderPlans(data.name);
    status.className = "plan-status ok";
    status.dataset.state = "ok";
    status.dataset.revision = data.revision;
    status.textContent = `Plan ${data.name} is now at revision ${data.revision}: ${describe(data)}. Its clients' next request uses it.`;
  } catch (err) {
    status.className = "plan-status failed";
    status.dataset.state = "failed";
    status.textContent = "Not applied: " + err.message;
  } finally {
    submit.disabled = false;
  }
}

// ---- Helpers ---------------------------------------------------------------

// swatch is a dot of color, styled through the CSSOM: the page's
// Content-Security-Policy allows no inline style attributes.
function swatch(color) {
  const s = document.createElement("span");
  s.className = "swatch";
  s.setAttribute("aria-hidden", "true");
  s.style.background = color;
  return s;
}

function clock(d) {
  const p = (n, w = 2) => String(n).padStart(w, "0");
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

function escapeHTML(s) {
  return String(s).replace(/[&<>"']/g, (ch) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[ch]);
}

init();
