// The shard page: the list from api/shards, one shard's chart from its observations.
// Plain DOM and SVG (no library); every value goes in as text, never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const PAGE_SIZE = 50;
let selected = null;
let listOffset = 0;
let listMatch = "";
let chartSeconds = 6 * 3600;
// Until a range is clicked, a shard's chart opens at the smallest range that holds all its
// recorded observations (a new shard's points fill the width instead of its right edge).
let chartChosen = false;
// A deep link named a shard that is not listed: no other shard is selected in its place.
let deepMissed = false;
let chartData = null;
// A deep link (?conn=...&shard=..., the operators' "Shard page" link) opens that shard.
const query = new URLSearchParams(location.search);
let wanted = query.get("shard") ? { conn_id: query.get("conn") || "upsert_default", shard: query.get("shard") } : null;

// A link to a view of Airflow's UI (``path`` relative to its root; the page is served at
// <root>/upsert-provider-ui/). Framed by Airflow's UI, which sandboxes the frame (no top
// navigation), the click hands the path to the UI's router in the parent window; opened on its
// own, the link navigates as usual.
function airflowLink(path, text, cls) {
  const a = el("a", { href: `../${path}`, class: cls || "airflow-link" }, text);
  a.addEventListener("click", (event) => {
    event.stopPropagation();
    let parent = null;
    try {
      parent = window.parent !== window && window.parent.location.origin === location.origin ? window.parent : null;
    } catch (e) {
      parent = null;
    }
    if (!parent || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
    event.preventDefault();
    const target = new URL(a.href);
    const idx = ((parent.history.state && parent.history.state.idx) || 0) + 1;
    parent.history.pushState({ usr: null, key: Math.random().toString(36).slice(2, 10), idx }, "",
      target.pathname + target.search);
    parent.dispatchEvent(new PopStateEvent("popstate", { state: parent.history.state }));
  });
  return a;
}

// Airflow's theme. Its UI marks its <html> with the class "dark" or "light" and keeps the
// choice in localStorage "theme" ("light", "dark" or "system"); the frame is same-origin, so
// the page reads the parent's class, else the stored choice, else the system's preference.
function airflowTheme() {
  try {
    if (window.parent !== window) {
      const classes = window.parent.document.documentElement.classList;
      if (classes.contains("dark")) return "dark";
      if (classes.contains("light")) return "light";
    }
  } catch (e) { /* not framed by Airflow's UI */ }
  let stored = null;
  try { stored = localStorage.getItem("theme"); } catch (e) { stored = null; }
  if (stored === "dark" || stored === "light") return stored;
  return window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}

function applyTheme() {
  document.documentElement.dataset.theme = airflowTheme();
}

function followTheme() {
  applyTheme();
  window.addEventListener("storage", (event) => { if (event.key === "theme") applyTheme(); });
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", applyTheme);
  try {
    if (window.parent !== window) {
      new MutationObserver(applyTheme).observe(window.parent.document.documentElement,
        { attributes: true, attributeFilter: ["class"] });
    }
  } catch (e) { /* not framed by Airflow's UI */ }
}

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function when(t) {
  return t ? new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "—";
}

function num(n) {
  return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US");
}

function badge(status) {
  const value = (status || "unknown").toLowerCase();
  return el("span", { class: `badge ${value}` }, status || "unknown");
}

function cell(row, content, cls) {
  const td = el("td", cls ? { class: cls } : {});
  if (content instanceof Node) td.appendChild(content); else td.textContent = content;
  row.appendChild(td);
  return td;
}

function renderShards(data) {
  const body = document.querySelector("#shards tbody");
  body.replaceChildren();
  const errors = data.connections.filter((c) => c.error).map((c) => `${c.conn_id}: ${c.error}`);
  const box = document.getElementById("errors");
  box.hidden = errors.length === 0;
  box.textContent = errors.join("\n");
  if (data.shards.length === 0) {
    const tr = el("tr");
    cell(tr, data.match ? `No shard id contains "${data.match}".` : noShardText(data)).setAttribute("colspan", "10");
    body.appendChild(tr);
  }
  listOffset = data.offset;
  const shown = data.shards.length;
  document.getElementById("range").textContent = shown
    ? `shards ${num(data.offset + 1)}–${num(data.offset + shown)} of ${num(data.total)}` : `0 of ${num(data.total)}`;
  document.getElementById("prev").disabled = data.offset === 0;
  document.getElementById("next").disabled = data.offset + data.limit >= data.total;
  for (const s of data.shards) {
    const tr = el("tr", { "data-conn": s.conn_id, "data-shard": s.shard });
    // The verdict comes right after the shard's name: on a narrow window it stays in view.
    const name = cell(tr, s.shard, "shard");
    name.appendChild(el("span", { class: "reason conn" }, s.conn_id));
    const links = s.links || {};
    if (links.asset || links.dag_runs) {
      const span = el("span", { class: "links" });
      if (links.asset) span.appendChild(airflowLink(links.asset, "Asset", "asset-link"));
      if (links.dag_runs) span.appendChild(airflowLink(links.dag_runs, "DAG runs", "runs-link"));
      name.appendChild(span);
    }
    const frontier = cell(tr, badge(s.frontier ? s.frontier.status : null), "frontier");
    for (const reason of (s.frontier ? s.frontier.reasons : []).slice(0, 2)) {
      frontier.appendChild(el("span", { class: "reason" }, reason));
    }
    if (s.monitor && s.monitor.firing) {
      frontier.appendChild(el("span", { class: "reason page-open" },
        `page open since ${when(s.monitor.incident_started_at)} (${s.monitor.firing_status})`));
    }
    for (const error of s.errors || []) frontier.appendChild(el("span", { class: "reason" }, error));
    cell(tr, s.lag_text || "—", "num lag");
    cell(tr, s.pending_for || "—", "num pending-for");
    const stream = cell(tr, badge(s.stream ? s.stream.status : null), "stream");
    if (s.stream && s.stream.reason) stream.appendChild(el("span", { class: "reason" }, s.stream.reason));
    cell(tr, num(s.upper), "num upper");
    cell(tr, num(s.since), "num since");
    const rows = cell(tr, s.last_batch ? `${num(s.last_batch.rows_in)} / ${num(s.last_batch.rows_out)}` : "—", "num rows");
    const ignored = Object.entries((s.last_batch && s.last_batch.unknown_fields) || {});
    if (ignored.length) {
      rows.appendChild(el("span", { class: "reason unknown-fields" },
        `ignored, not in the schema: ${ignored.map(([name, f]) => `${name} (${num(f.records)})`).join(", ")}`));
    }
    const commit = cell(tr, when(s.last_commit_at), "last-commit");
    if (s.last_writer) {
      const writer = el("span", { class: "reason" });
      writer.appendChild(s.links && s.links.writer ? airflowLink(s.links.writer, s.last_writer, "writer-link")
        : document.createTextNode(s.last_writer));
      commit.appendChild(writer);
    }
    cell(tr, s.last_checkpoint ? `${s.last_checkpoint.id} (upper ${s.last_checkpoint.upper})` : "—", "checkpoint");
    tr.addEventListener("click", () => select(s, true));
    body.appendChild(tr);
  }
  // A store that did not answer in time: its shards are unknown, the row says so.
  for (const c of data.connections.filter((c) => c.unreachable)) {
    const tr = el("tr", { class: "unreachable", "data-unreachable": c.conn_id });
    cell(tr, c.conn_id, "shard");
    cell(tr, badge("unreachable"), "frontier").appendChild(el("span", { class: "reason" }, c.error));
    tr.lastChild.setAttribute("colspan", "9");
    body.appendChild(tr);
  }
  const find = (want) => want && data.shards.find((s) => s.conn_id === want.conn_id && s.shard === want.shard);
  const deep = find(wanted);
  const again = deep || find(selected);
  if (wanted && !deep) {
    box.hidden = false;
    box.textContent += `${box.textContent ? "\n" : ""}no shard ${wanted.shard} in connection ${wanted.conn_id}` +
      (data.unreadable ? ` that your role may read (it may not read ${num(data.unreadable)} upsert connection(s))` : "");
  }
  // A deep link to a shard that is not there selects nothing: the detail would be another shard's.
  deepMissed = deepMissed || Boolean(wanted && !deep);
  wanted = null;
  if (again) select(again, Boolean(deep));
  else if (!deepMissed && data.shards.length) select(data.shards[0]);
  else document.getElementById("detail").hidden = true;
  document.getElementById("refreshed").textContent = `as of ${when(data.generated_at)}`;
}

// Why no shard is listed: none exists, or the user's role may not read the connections.
function noShardText(data) {
  if (data.unreadable && !data.connections.length) {
    return `No shard you may see: your role may not read the ${num(data.unreadable)} upsert connection(s) ` +
      "(reading a connection's shards needs read access on Connections; ask an administrator).";
  }
  const more = data.unreadable ? ` (your role may not read ${num(data.unreadable)} more upsert connection(s))` : "";
  return `No shard in any upsert connection you may read${more}.`;
}

// ``reveal``: a click on the row or a deep link brings the detail (below the list) into view.
function select(shard, reveal) {
  selected = shard;
  for (const tr of document.querySelectorAll("#shards tbody tr")) {
    tr.classList.toggle("selected", tr.dataset.conn === shard.conn_id && tr.dataset.shard === shard.shard);
  }
  const detail = document.getElementById("detail");
  detail.hidden = false;
  document.getElementById("chart-title").textContent = `${shard.shard} (${shard.conn_id}): committed against the source`;
  const reasons = document.getElementById("reasons");
  reasons.replaceChildren(...(shard.frontier ? shard.frontier.reasons : []).map((r) => el("li", {}, r)));
  renderVerdict(shard);
  renderSchema(shard);
  loadChart(shard);
  if (reveal) detail.scrollIntoView({ block: "start" });
}

function markRange(seconds) {
  for (const button of document.querySelectorAll("#ranges button")) {
    button.classList.toggle("active", Number(button.dataset.seconds) === seconds);
  }
}

// The smallest range offered that holds every point fetched (the fetch asked for the largest
// range wanted), or the range fetched.
function fittingRange(data) {
  if (!data.points.length) return data.to - data.from;
  const age = data.to - data.points[0].t;
  const offered = [...document.querySelectorAll("#ranges button")].map((b) => Number(b.dataset.seconds));
  return offered.sort((a, b) => a - b).find((seconds) => seconds >= age) || data.to - data.from;
}

function loadChart(shard) {
  markRange(chartSeconds);
  const url = `api/shards/${encodeURIComponent(shard.shard)}/observations?conn=${encodeURIComponent(shard.conn_id)}` +
    `&seconds=${chartSeconds}`;
  fetch(url, { credentials: "same-origin" })
    .then(answer)
    .then((data) => {
      if (selected !== shard) return;
      if (!chartChosen) {
        const seconds = Math.min(fittingRange(data), data.to - data.from);
        data = Object.assign({}, data, { from: data.to - seconds, points: data.points.filter((p) => p.t >= data.to - seconds) });
        markRange(seconds);
      }
      chartData = data;
      drawChart(data);
      renderPartitions(data);
    })
    .catch((e) => { document.getElementById("chart").textContent = `observations: ${e.message}`; });
}

function facts(id, pairs) {
  const list = document.getElementById(id);
  list.replaceChildren();
  for (const [name, value] of pairs) {
    list.appendChild(el("dt", {}, name));
    list.appendChild(el("dd", {}, value));
  }
}

// A threshold as the server formatted it ("2m00s"), with its seconds when they say more.
function seconds(f, name) {
  const s = (f.thresholds || {})[name];
  const text = (f.thresholds_text || {})[name];
  if (s === null || s === undefined) return "—";
  return s < 60 ? text : `${text} (${num(s)}s)`;
}

// The table's schema version now, and each version: when, by whom, what it changed.
function renderSchema(shard) {
  const schema = shard.schema;
  document.getElementById("schema-version").textContent = schema ? `version ${num(schema.version)}` : "—";
  const body = document.querySelector("#schema-history tbody");
  body.replaceChildren();
  for (const v of schema ? schema.history : []) {
    const tr = el("tr", { "data-version": String(v.version) });
    cell(tr, num(v.version), "num version");
    cell(tr, when(v.created_at), "when");
    cell(tr, v.created_by || "—", "by");
    cell(tr, v.change_text, "change");
    body.appendChild(tr);
  }
}

// Which thresholds judged the shard (its monitor's, or the defaults) and what its monitor last decided.
function renderVerdict(shard) {
  const f = shard.frontier || {};
  document.getElementById("judged-with").textContent = f.judged_with === "monitor"
    ? "Judged with the thresholds the shard's monitor last evaluated with." : (f.note || "");
  const m = shard.monitor;
  facts("monitor", m ? [
    ["Monitor's last evaluation", `${when(m.last_evaluated_at)}: ${m.last_status || "—"}`],
    ["Evaluated by", m.evaluated_by || "—"],
    // As the alert state holds them: a page counts once a channel (PagerDuty, Slack) took it;
    // unsent_reason says why none did (no channel configured: pages were only logged).
    ["Page", m.firing ? `open, incident since ${when(m.incident_started_at)} (${m.firing_status})` : "none open"],
    ["Pages sent", num(m.pages_sent) + (m.pages_pending ? `, ${m.pages_pending} not delivered yet` : "")
      + (m.pages_dropped ? `, ${m.pages_dropped} dropped from a full outbox` : "")],
    ["Last delivered", m.last_sent_at ? when(m.last_sent_at) : (m.unsent_reason ? `never: ${m.unsent_reason}` : "never")],
  ] : [["Monitor", "none has evaluated this shard"]]);
  const t = f.thresholds || {};
  facts("thresholds", [
    ["Cadence", seconds(f, "cadence_seconds")],
    ["Stalled after", `${seconds(f, "stall_seconds")} = max(${t.stall_multiplier} x cadence, ${seconds(f, "min_stall_seconds")})`],
    ["Stale after", seconds(f, "stale_after_seconds")],
    ["Window", seconds(f, "window_seconds")],
    ["Breaches before a page", num(t.consecutive_breaches)],
    ["Lag objective", seconds(f, "lag_seconds_objective")],
  ]);
}

// Lag per partition in the shard's unit, as the newest observation recorded it (the partitions
// with the most lag; the others counted in the note). A directory's offsets are segment file
// numbers: an observation recorded before the lag per partition was kept has it for the whole shard only.
function renderPartitions(data) {
  const body = document.querySelector("#partitions tbody");
  body.replaceChildren();
  const unit = data.lag_unit || "offsets";
  document.getElementById("partitions-lag").textContent = `Lag (${unit})`;
  const note = document.getElementById("partitions-note");
  const recorded = data.partition_lag;
  if (recorded) {
    note.hidden = !recorded.others;
    note.textContent = note.hidden ? "" : `${num(recorded.others)} more partition(s) hold ` +
      `${num(recorded.others_lag)} ${unit} (the ${num(recorded.top.length)} with the most lag are shown).`;
  } else {
    note.hidden = !data.partitions.length || unit === "records";
    note.textContent = note.hidden ? "" : `A directory's offsets are segment file numbers: the shard's lag is ` +
      `${data.lag_text} pending in all, counted in segments not bound yet (per partition: not recorded).`;
  }
  document.getElementById("partitions-at").textContent = data.partitions_at ? `as observed at ${when(data.partitions_at)}` : "";
  if (!data.partitions.length) {
    const tr = el("tr");
    cell(tr, "No observation in this range.").setAttribute("colspan", "4");
    body.appendChild(tr);
  }
  for (const p of data.partitions) {
    const tr = el("tr", { "data-partition": p.partition });
    cell(tr, p.partition);
    cell(tr, num(p.high_watermark), "num");
    cell(tr, num(p.bound), "num");
    cell(tr, p.lag === null ? "—" : num(p.lag), "num lag");
    body.appendChild(tr);
  }
}

function clock(t, span) {
  const iso = new Date(t * 1000).toISOString();
  return span > 86400 ? iso.slice(5, 16).replace("T", " ") : iso.slice(11, 16);
}

// The chart spans the whole range asked for (1h, 6h, 24h) at the box's full width.
function drawChart(data) {
  const points = data.points;
  const box = document.getElementById("chart");
  box.replaceChildren();
  if (!points.length) {
    box.appendChild(el("p", { class: "muted" }, "No frontier observation recorded in this range."));
    return;
  }
  const W = Math.max(360, box.clientWidth || 760), H = 300, L = 84, R = 18, T = 14, B = 52;
  const t0 = data.from, t1 = data.to;
  // In the shard's lag unit: a Kafka offset is a record, so the source's high watermark and the
  // committed offsets are drawn; a directory's offsets are segment file numbers, so what is
  // drawn is its lag, the segments pending.
  const unit = points[points.length - 1].lag_unit || "offsets";
  const series = unit === "records"
    ? [["high_watermark", "hw", "high watermark"], ["bound", "bound", "committed"]]
    : [["lag", "lag", "pending"]];
  legend(series, unit);
  const ys = points.flatMap((p) => series.map(([key]) => p[key]));
  const y0 = Math.min(0, ...ys), y1 = Math.max(1, ...ys);
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => H - B - ((v - y0) / (y1 - y0)) * (H - T - B);
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
    "aria-label": unit === "records" ? "committed offsets and source high watermark over time" : `${unit} pending over time` });
  for (let i = 0; i <= 4; i++) {
    const v = y0 + ((y1 - y0) * i) / 4;
    svg.appendChild(el("svg:line", { class: "grid", x1: L, y1: y(v), x2: W - R, y2: y(v) }));
    svg.appendChild(el("svg:text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, num(Math.round(v))));
  }
  const ticks = Math.max(2, Math.min(8, Math.floor((W - L - R) / 110)));
  for (let i = 0; i <= ticks; i++) {
    const t = t0 + ((t1 - t0) * i) / ticks;
    svg.appendChild(el("svg:line", { class: "tick", x1: x(t), y1: H - B, x2: x(t), y2: H - B + 4 }));
    svg.appendChild(el("svg:text", { x: x(t), y: H - B + 16, "text-anchor": i === 0 ? "start" : i === ticks ? "end" : "middle" },
      clock(t, t1 - t0)));
  }
  svg.appendChild(el("svg:line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  svg.appendChild(el("svg:line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  svg.appendChild(el("svg:text", { class: "axis-title x-title", x: L + (W - L - R) / 2, y: H - 8, "text-anchor": "middle" },
    `time (UTC), ${when(t0)} to ${when(t1)}`));
  svg.appendChild(el("svg:text", { class: "axis-title y-title", x: 14, y: T + (H - T - B) / 2, "text-anchor": "middle",
    transform: `rotate(-90 14 ${T + (H - T - B) / 2})` },
    unit === "records" ? "records: offsets (sum over partitions)" : `${unit} pending`));
  for (const [key, cls, label] of series) {
    // A step line: a value holds until the next observation.
    const coords = [];
    points.forEach((p, i) => {
      if (i) coords.push(`${x(p.t)},${y(points[i - 1][key])}`);
      coords.push(`${x(p.t)},${y(p[key])}`);
    });
    svg.appendChild(el("svg:polyline", { class: `line ${cls}`, points: coords.join(" ") }));
    for (const p of points) {
      const dot = el("svg:circle", { class: `pt ${cls}`, cx: x(p.t), cy: y(p[key]), r: 3 });
      dot.appendChild(el("svg:title", {}, `${when(p.t)}: ${label} ${num(p[key])}, upper ${p.upper}, ` +
        `lag ${num(p.lag)} ${p.lag_unit} (${p.observer})`));
      svg.appendChild(dot);
    }
  }
  box.appendChild(svg);
}

function legend(series, unit) {
  const box = document.getElementById("legend");
  box.replaceChildren();
  const texts = { hw: "source high watermark", bound: "committed (offsets bound at the upper)", lag: `${unit} pending` };
  for (const [, cls] of series) {
    box.appendChild(el("span", { class: `key ${cls}` }));
    box.appendChild(document.createTextNode(` ${texts[cls]} `));
  }
}

function answer(r) {
  if (r.status === 401) return Promise.reject(new Error("signed out of Airflow: reload the page to sign in again"));
  return r.ok ? r.json() : Promise.reject(new Error(`HTTP ${r.status}`));
}

function load() {
  const params = new URLSearchParams({ offset: String(listOffset), limit: String(PAGE_SIZE), match: listMatch });
  if (wanted) {
    params.set("conn", wanted.conn_id);
    params.set("shard", wanted.shard);
  }
  fetch(`api/shards?${params}`, { credentials: "same-origin" })
    .then(answer)
    .then(renderShards)
    .catch((e) => {
      const box = document.getElementById("errors");
      box.hidden = false;
      box.textContent = `shards: ${e.message}`;
    });
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("prev").addEventListener("click", () => { listOffset = Math.max(0, listOffset - PAGE_SIZE); load(); });
  document.getElementById("next").addEventListener("click", () => { listOffset += PAGE_SIZE; load(); });
  let typing = null;
  document.getElementById("match").addEventListener("input", (event) => {
    clearTimeout(typing);
    typing = setTimeout(() => { listMatch = event.target.value; listOffset = 0; load(); }, 250);
  });
  for (const button of document.querySelectorAll("#ranges button")) {
    button.addEventListener("click", () => {
      chartSeconds = Number(button.dataset.seconds);
      chartChosen = true;
      if (selected) loadChart(selected);
    });
  }
  let resizing = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => { if (chartData) drawChart(chartData); }, 150);
  });
  load();
  setInterval(load, 30000);
});

followTheme();
