// The GPU cluster page: hash routes over the metrics service's read-only JSON (/ui/api/...). No framework: each
// view is a function from the API's answer to HTML. A figure the service does not have is null in the JSON and
// "no data" here, never 0. Every pod, node and card is a link.

// ?refresh=<seconds> sets how often the view is fetched again; 0 stops it (the browser tests use it).
const REFRESH_MS = 1000 * Number(new URLSearchParams(location.search).get("refresh") ?? 15);
const NO_DATA = '<span class="nodata">no data</span>';
const TOKEN_KEY = "hami-metrics-token";
const view = document.getElementById("view");
let charts = [];
let timer = null;

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const num = (v, digits = 0) => (v === null || v === undefined ? NO_DATA : Number(v).toLocaleString("en-US", { maximumFractionDigits: digits }));
const cell = (field, v, digits = 0) => `<td class="num" data-field="${field}" data-value="${v ?? ""}">${num(v, digits)}</td>`;
const pct = (part, whole) => (part === null || part === undefined || !whole ? null : (100 * part) / whole);
const bar = (p) => (p === null ? "" : `<span class="bar"><span style="width:${Math.min(100, p).toFixed(1)}%"></span></span>`);
const nodeLink = (n) => (n ? `<a href="#/node/${encodeURIComponent(n)}" data-node="${esc(n)}">${esc(n)}</a>` : "-");
const cardLink = (u, label) => `<a href="#/card/${encodeURIComponent(u)}" data-card="${esc(u)}">${esc(label ?? short(u))}</a>`;
const podLink = (uid, ns, name) => `<a href="#/workload/${encodeURIComponent(uid)}" data-pod="${esc(uid)}">${esc(ns)}/${esc(name || uid)}</a>`;
const short = (u) => (/^[A-Za-z]*-?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-/.test(u) ? u.slice(0, 12) : u);

async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const reply = await fetch(`api${path}`, { headers });
  if (reply.status === 401) {
    await askToken();
    return api(path);
  }
  if (!reply.ok) {
    const body = await reply.json().catch(() => ({}));
    throw new Error(`${reply.status}: ${typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail ?? body)}`);
  }
  return reply.json();
}

function askToken() {
  const dialog = document.getElementById("login");
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
      resolve();
    }, { once: true });
    dialog.showModal();
  });
}

function table(headers, rows, id) {
  const head = headers.map((h) => `<th class="${h.endsWith("#") ? "num" : ""}">${esc(h.replace(/#$/, ""))}</th>`).join("");
  return `<table id="${id}"><thead><tr>${head}</tr></thead><tbody>${rows.join("") || `<tr><td colspan="${headers.length}">none</td></tr>`}</tbody></table>`;
}

// --- charts (uPlot, built by `make webui`) ---------------------------------------------------------------------
const LABELS = {
  memory_mib: "capacity MiB", memory_booked_mib: "booked MiB", memory_used_mib: "used MiB",
  cores_booked: "cores booked %", utilization_percent: "utilisation %", sm_util_percent: "SM utilisation %",
};
const COLORS = ["#9aa3b5", "#2f6fde", "#d9534f", "#3ba272", "#e0a030"];

function chart(target, history, fields, title) {
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.chart = title;
  target.appendChild(box);
  if (!history || history.t.length === 0) {
    box.innerHTML = `<strong>${esc(title)}</strong>: ${NO_DATA} (not sampled yet: the service samples every --history-interval-s)`;
    return;
  }
  if (typeof window.uPlot !== "function") {
    box.innerHTML = `<strong>${esc(title)}</strong>: charts unavailable: the charting library is not built (run make webui)`;
    return;
  }
  const picked = fields.filter((f) => history.fields.includes(f));
  const data = [history.t, ...picked.map((f) => history.values[history.fields.indexOf(f)])];
  const series = [{}, ...picked.map((f, i) => ({ label: LABELS[f] ?? f, stroke: COLORS[(i + 1) % COLORS.length], width: 2 }))];
  const width = Math.max(320, Math.min(900, view.clientWidth - 40));
  // one sample (a fresh service) still gets a readable axis: ten minutes around it, and room for big numbers
  const [first, last] = [history.t[0], history.t[history.t.length - 1]];
  const x = first === last ? { time: true, auto: false, range: () => [first - 300, last + 300] } : { time: true };
  const level = (u, min, max) => [Math.min(0, min ?? 0), Math.max(1, (max ?? 0) * 1.1)];
  const scales = { x, y: { range: level } };
  const axes = [{}, { size: 70 }];
  charts.push(new window.uPlot({ title, width, height: 200, series, scales, axes }, data, box));
}

// --- views -------------------------------------------------------------------------------------------------------
function heatColor(p) {
  // white (0 %) to deep orange (100 %)
  const t = Math.max(0, Math.min(1, p / 100));
  return `rgb(${255}, ${Math.round(245 - 150 * t)}, ${Math.round(235 - 215 * t)})`;
}

function heatmap(cards, measure) {
  const value = (c) =>
    measure === "used" ? pct(c.memory_used_mib, c.memory_mib) : measure === "util" ? c.utilization_percent : pct(c.memory_booked_mib, c.memory_mib);
  const cells = cards.map((c) => {
    const p = value(c);
    const label = `${c.node} #${c.index}`;
    const title = `${c.node} ${c.uuid} (${c.model}): ${p === null ? "no data" : p.toFixed(0) + "%"}`;
    const style = p === null ? "" : `style="background:${heatColor(p)}"`;
    return `<a href="#/card/${encodeURIComponent(c.uuid)}" data-card="${esc(c.uuid)}" class="${p === null ? "unknown" : ""}" ${style} title="${esc(title)}">${esc(label)}<br>${p === null ? "no data" : p.toFixed(0) + "%"}</a>`;
  });
  return `<div class="heat" id="heatmap">${cells.join("")}</div>`;
}

async function overview() {
  const { overview: o, trend, cards } = await api("/overview");
  const tile = (label, value, field, extra = "") =>
    `<div class="tile"><div class="label">${label}</div><div class="value" data-field="${field}" data-value="${value ?? ""}">${num(value)}${extra}</div></div>`;
  const models = o.models.map((m) => `<tr><td>${esc(m.vendor)}</td><td>${esc(m.model)}</td>${cell("cards", m.cards)}${cell("memory_mib", m.memory_mib)}${cell("memory_booked_mib", m.memory_booked_mib)}${cell("memory_used_mib", m.memory_used_mib)}${cell("cores_booked", m.cores_booked)}</tr>`);
  view.innerHTML = `<h1>Overview</h1>
    <div class="tiles">
      ${tile("Nodes", o.nodes, "nodes")}${tile("Cards", o.cards, "cards")}
      ${tile("Pods bound", o.pods_bound, "pods_bound")}${tile("Pods pending", o.pods_pending, "pods_pending")}
      ${tile("Memory MiB", o.memory_mib, "memory_mib")}
      ${tile("Booked MiB", o.memory_booked_mib, "memory_booked_mib", bar(pct(o.memory_booked_mib, o.memory_mib)))}
      ${tile("Used MiB", o.memory_used_mib, "memory_used_mib", bar(pct(o.memory_used_mib, o.memory_mib)))}
      ${tile("Cores booked %", o.cores_booked, "cores_booked")}
      ${tile("Utilisation %", o.utilization_percent, "utilization_percent")}
    </div>
    <p class="legend">Used figures cover the ${o.cards_reporting} of ${o.cards} cards whose node agent sent a device sample.</p>
    <h2>By vendor and model</h2>
    ${table(["Vendor", "Model", "Cards#", "Memory MiB#", "Booked MiB#", "Used MiB#", "Cores booked %#"], models, "models")}
    <h2>Trends</h2><div id="trends"></div>
    <h2>Heat map of the cards</h2>
    <label class="legend">colour by <select id="measure"><option value="booked">booked memory</option><option value="used">used memory</option><option value="util">utilisation</option></select></label>
    <div id="heat">${heatmap(cards, "booked")}</div>`;
  const trends = document.getElementById("trends");
  chart(trends, trend, ["memory_mib", "memory_booked_mib", "memory_used_mib"], "Cluster memory (MiB)");
  chart(trends, trend, ["cores_booked", "utilization_percent"], "Cluster cores booked and utilisation");
  document.getElementById("measure").addEventListener("change", (e) => {
    document.getElementById("heat").innerHTML = heatmap(cards, e.target.value);
  });
}

function cardRow(c) {
  return `<tr data-uuid="${esc(c.uuid)}"><td>${nodeLink(c.node)}</td><td>${cardLink(c.uuid)}</td><td>${esc(c.vendor)}</td><td>${esc(c.model)}</td>
    ${cell("memory_booked_mib", c.memory_booked_mib)}${cell("memory_mib", c.memory_mib)}${cell("memory_used_mib", c.memory_used_mib)}
    ${cell("cores_booked", c.cores_booked)}${cell("utilization_percent", c.utilization_percent)}
    <td class="num" data-field="slices">${c.slices_booked}/${c.slices}</td><td>${c.health ? "healthy" : '<span class="error">unhealthy</span>'}</td></tr>`;
}
const CARD_HEADERS = ["Node", "Card", "Vendor", "Model", "Booked MiB#", "Memory MiB#", "Used MiB#", "Cores booked %#", "Utilisation %#", "Slices#", "Health"];

async function cardsView() {
  const cards = await api("/cards");
  view.innerHTML = `<h1>Cards</h1><input id="filter" placeholder="filter: node, model, uuid">
    ${table(CARD_HEADERS, cards.map(cardRow), "cards")}`;
  filterRows("cards");
}

async function cardView(uuid) {
  const { detail, history } = await api(`/cards/${encodeURIComponent(uuid)}`);
  const c = detail.card;
  const holders = detail.holders.map((h) => `<tr data-uid="${esc(h.uid)}"><td>${podLink(h.uid, h.namespace, h.name)}</td>${cell("memory_mib", h.memory_mib)}${cell("cores", h.cores)}</tr>`);
  const mig = detail.mig.map((m) => `<tr><td>${esc(m.profile)}</td><td>${m.start}+${m.size}</td><td>${m.mig_uuid ? esc(m.mig_uuid) : "(creating)"}</td><td>${podLink(m.pod_uid, ...m.pod.split("/"))}</td></tr>`);
  view.innerHTML = `<h1>Card ${esc(c.uuid)}</h1>
    <p>${esc(c.model)} (${esc(c.vendor)}) #${c.index} on ${nodeLink(c.node)}</p>
    ${table(CARD_HEADERS, [cardRow(c)], "card")}
    <h2>Who holds it</h2>${table(["Pod", "Booked MiB#", "Cores %#"], holders, "holders")}
    ${mig.length ? `<h2>MIG instances</h2>${table(["Profile", "Placement", "MIG device", "Pod"], mig, "mig")}` : ""}
    <h2>History</h2><div id="history"></div>`;
  const box = document.getElementById("history");
  chart(box, history, ["memory_booked_mib", "memory_used_mib"], "Memory (MiB)");
  chart(box, history, ["cores_booked", "utilization_percent"], "Cores booked and utilisation (%)");
}

function nodeRow(n) {
  return `<tr data-node="${esc(n.name)}"><td>${nodeLink(n.name)}</td><td>${esc(n.vendors.join(", ") || "-")}</td>${cell("cards", n.cards)}
    ${cell("memory_booked_mib", n.memory_booked_mib)}${cell("memory_mib", n.memory_mib)}${cell("memory_used_mib", n.memory_used_mib)}
    ${cell("cores_booked", n.cores_booked)}${cell("pods", n.pods)}${cell("last_seen_s", n.last_seen_s, 1)}</tr>`;
}
const NODE_HEADERS = ["Node", "Vendors", "Cards#", "Booked MiB#", "Memory MiB#", "Used MiB#", "Cores booked %#", "Pods#", "Last report s ago#"];

async function nodesView() {
  const nodes = await api("/nodes");
  view.innerHTML = `<h1>Nodes</h1><input id="filter" placeholder="filter">${table(NODE_HEADERS, nodes.map(nodeRow), "nodes")}`;
  filterRows("nodes");
}

async function nodeView(name) {
  const d = await api(`/nodes/${encodeURIComponent(name)}`);
  view.innerHTML = `<h1>Node ${esc(d.node.name)}</h1>${table(NODE_HEADERS, [nodeRow(d.node)], "node")}
    <h2>Cards</h2>${table(CARD_HEADERS, d.cards.map(cardRow), "cards")}
    <h2>Pods</h2>${table(WORKLOAD_HEADERS, d.pods.map(workloadRow), "workloads")}`;
}

function workloadRow(w) {
  const state = w.state === "pending" ? `<span class="pending" title="${esc(w.reason)}">pending ${num(w.waiting_s, 1)} s</span>` : esc(w.state);
  return `<tr data-uid="${esc(w.uid)}"><td>${podLink(w.uid, w.namespace, w.name)}</td><td>${state}</td><td>${nodeLink(w.node)}</td>
    <td>${w.cards.map((u) => cardLink(u)).join(" ") || "-"}</td>${cell("memory_booked_mib", w.memory_booked_mib)}
    ${cell("memory_used_mib", w.memory_used_mib, 1)}${cell("cores_booked", w.cores_booked)}${cell("sm_util_percent", w.sm_util_percent)}</tr>`;
}
const WORKLOAD_HEADERS = ["Pod", "State", "Node", "Cards", "Booked MiB#", "Used MiB#", "Cores booked %#", "SM util %#"];

async function workloadsView() {
  const rows = await api("/workloads");
  view.innerHTML = `<h1>Workloads</h1><input id="filter" placeholder="filter: namespace, pod, node">
    ${table(WORKLOAD_HEADERS, rows.map(workloadRow), "workloads")}`;
  filterRows("workloads");
}

async function workloadView(uid) {
  const { detail: d, history } = await api(`/workloads/${encodeURIComponent(uid)}`);
  const grants = d.grants.map((g) => `<tr data-uuid="${esc(g.uuid)}"><td>${cardLink(g.uuid, g.uuid)}</td><td>${g.model ? esc(g.model) : NO_DATA}</td>${cell("memory_mib", g.memory_mib)}${cell("cores", g.cores)}</tr>`);
  const usage = d.usage.map((u) => `<tr><td>${esc(u.container)}</td><td>${cardLink(u.uuid)}</td>${cell("used_mib", u.used_mib, 1)}${cell("limit_mib", u.limit_mib, 1)}${cell("sm_util_percent", u.sm_util_percent)}${cell("seen_s", u.seen_s, 1)}</tr>`);
  view.innerHTML = `<h1>Pod ${esc(d.pod.namespace)}/${esc(d.pod.name)}</h1>
    <p>uid ${esc(d.pod.uid)}; ${esc(d.pod.state)}${d.pod.node ? ` on ${nodeLink(d.pod.node)}` : ""}</p>
    ${d.pod.reason ? `<p class="pending" id="reason">Why it waits: ${esc(d.pod.reason)}</p>` : ""}
    <h2>Scheduling path</h2><ol class="path" id="path">${d.path.map((l) => `<li>${esc(l)}</li>`).join("")}</ol>
    <h2>Grant</h2>${table(["Card", "Model", "Booked MiB#", "Cores %#"], grants, "grants")}
    <h2>Usage (from the interposer)</h2>
    ${d.usage.length ? table(["Container", "Card", "Used MiB#", "Limit MiB#", "SM util %#", "Report s ago#"], usage, "usage") : `<p id="usage">${NO_DATA}: no usage report from the interposer yet</p>`}
    <h2>History</h2><div id="history"></div>`;
  if (d.pod.state !== "pending") {
    const box = document.getElementById("history");
    chart(box, history, ["memory_booked_mib", "memory_used_mib"], "Memory (MiB)");
    chart(box, history, ["sm_util_percent"], "SM utilisation (%)");
  }
}

async function quotasView() {
  const rows = await api("/quotas");
  const body = rows.map((q) => `<tr><td>${esc(q.namespace)}</td><td>${esc(q.resource)}</td>${cell("used", q.used)}
    <td class="num">${q.limit === null ? "no limit" : num(q.limit)}</td><td class="num">${q.percent === null ? "-" : num(q.percent, 1) + "%"}${bar(q.percent)}</td></tr>`);
  view.innerHTML = `<h1>Quotas</h1><p class="legend">GPU resources of each namespace's ResourceQuota, as the webhook counts them.</p>
    ${table(["Namespace", "Resource", "Used#", "Limit#", "Use#"], body, "quotas")}`;
}

function filterRows(id) {
  const input = document.getElementById("filter");
  input.addEventListener("input", () => {
    const words = input.value.toLowerCase();
    for (const row of document.querySelectorAll(`#${id} tbody tr`)) row.hidden = words !== "" && !row.textContent.toLowerCase().includes(words);
  });
}

// --- routing -------------------------------------------------------------------------------------------------
const ROUTES = {
  overview: overview, nodes: nodesView, node: nodeView, cards: cardsView, card: cardView,
  workloads: workloadsView, workload: workloadView, quotas: quotasView,
};
const LIST_OF = { node: "nodes", card: "cards", workload: "workloads" };

async function render() {
  const [name, ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  const route = ROUTES[name] ? name : "overview";
  const arg = rest.length ? decodeURIComponent(rest.join("/")) : undefined;
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.nav === (LIST_OF[route] ?? route));
  for (const c of charts) c.destroy();
  charts = [];
  view.dataset.ready = "0";
  try {
    await ROUTES[route](arg);
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    view.innerHTML = `<h1>${esc(route)}</h1><p class="error" id="error">${esc(err.message)}</p>`;
  }
  view.dataset.view = route;
  view.dataset.renderedMs = performance.now().toFixed(1); // since navigation start: the benchmark reads it
  view.dataset.ready = "1";
  clearTimeout(timer);
  if (REFRESH_MS > 0) {
    timer = setTimeout(() => {
      if (document.activeElement?.id !== "filter") render();
    }, REFRESH_MS);
  }
}

window.addEventListener("hashchange", render);
// uPlot's script is deferred like this module: both have run before DOMContentLoaded
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", render);
else render();
