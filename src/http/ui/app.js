// gpu-extender web view: polls the JSON next to this page (ui/data) and draws it. No library,
// no build step, no request outside the extender. Read-only: it never writes anything.
"use strict";

const POLL_MS = 5000;
const dataUrl = location.pathname.replace(/\/+$/, "") + "/data";
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("gpu-extender-token") || "";
let last = null;
let lastText = "";
let timer = null;

// A token passed as #token=... is kept for the session and taken out of the address bar.
if (location.hash.startsWith("#token=")) {
  token = decodeURIComponent(location.hash.slice(7));
  sessionStorage.setItem("gpu-extender-token", token);
  history.replaceState(null, "", location.pathname + location.search);
}

function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function gib(mib) { return (mib / 1024).toFixed(mib % 1024 === 0 ? 0 : 1) + " GiB"; }
function pct(part, whole) { return whole > 0 ? Math.min(100, (100 * part) / whole) : 0; }
function namespaceOf(pod) { return pod.split("/")[0]; }
function colour(pod) {
  let h = 2166136261;
  for (let i = 0; i < pod.length; i++) h = Math.imul(h ^ pod.charCodeAt(i), 16777619);
  h ^= h >>> 13;
  h = Math.imul(h, 2654435761);
  return "hsl(" + ((h >>> 0) % 360) + ",55%,55%)";
}
function nodeModel(node) {
  const models = [...new Set(node.gpus.map((g) => g.model))];
  return models.length === 1 ? models[0] : models.join("+");
}

function holdTitle(hold, gpu) {
  const memory = hold.whole ? gpu.memoryMib : hold.memoryMib;
  const compute = hold.whole ? 1000 : hold.computeMilli;
  return hold.pod + " (namespace " + namespaceOf(hold.pod) + ")" + (hold.whole ? ": whole GPU" :
    ": " + gib(memory) + " of " + gib(gpu.memoryMib) + " (" + pct(memory, gpu.memoryMib).toFixed(0) +
    "%), compute " + (compute / 10).toFixed(0) + "%");
}

// A DRA claim on a GPU: the claim, its pods, and the MIG slice's memory when it holds one.
function claimTitle(held, gpu) {
  return "DRA claim " + held.claim + (held.pods.length ? " (pods " + held.pods.join(", ") + ")" : " (no pod yet)") +
    (held.migMemoryMib == null ? ": whole GPU" : ": MIG slice " + gib(held.migMemoryMib) + " of " + gib(gpu.memoryMib));
}

function gpuHtml(gpu) {
  let memory = "", compute = "";
  for (const hold of gpu.holds) {
    const c = colour(hold.pod), title = esc(holdTitle(hold, gpu));
    const mem = hold.whole ? 100 : pct(hold.memoryMib, gpu.memoryMib);
    const cmp = hold.whole ? 100 : hold.computeMilli / 10;
    memory += '<span class="seg" style="width:' + mem.toFixed(2) + "%;background:" + c + '" title="' + title + '"></span>';
    if (cmp > 0) compute += '<span class="seg" style="width:' + cmp.toFixed(2) + "%;background:" + c + '" title="' + title + '"></span>';
  }
  const claims = gpu.claims || [];
  for (const held of claims) {
    const c = colour(held.claim), title = esc(claimTitle(held, gpu));
    const mem = held.migMemoryMib == null ? 100 : pct(held.migMemoryMib, gpu.memoryMib);
    memory += '<span class="seg claim" style="width:' + mem.toFixed(2) + "%;background-color:" + c + '" title="' + title + '"></span>';
    compute += '<span class="seg claim" style="width:' + mem.toFixed(2) + "%;background-color:" + c + '" title="' + title + '"></span>';
  }
  const classes = "gpu" + (gpu.healthy ? "" : " unhealthy") + (gpu.island === null ? "" : " island-" + (gpu.island % 8));
  const label = (gpu.healthy ? "" : "✕ ") + "GPU" + gpu.index + (gpu.island === null ? "" : " NV" + gpu.island);
  return '<div class="' + classes + '" data-gpu="' + gpu.index + '" data-healthy="' + gpu.healthy +
    '" data-island="' + (gpu.island === null ? "" : gpu.island) + '" data-pods="' + esc(gpu.pods.join(" ")) +
    '" data-claims="' + esc(claims.map((held) => held.claim).join(" ")) +
    '" data-memory-allocated="' + gpu.memoryAllocatedMib + '" title="' + esc(gpu.model + (gpu.uuid ? " " + gpu.uuid : "") +
    (gpu.healthy ? "" : " — unhealthy")) + '"><div class="gpu-head"><span>' + label + "</span><span>" +
    gib(gpu.whole ? gpu.memoryMib : gpu.memoryAllocatedMib) + "/" + gib(gpu.memoryMib) +
    '</span></div><div class="bar mem">' + memory + '</div><div class="bar compute">' + compute + "</div></div>";
}

// One MIG profile of a node: slices held of those advertised, and who holds them.
function migHtml(pool) {
  const claims = pool.claims || [];
  const holders = pool.pods.map((h) => h.pod + (h.slices > 1 ? " x" + h.slices : ""))
    .concat(claims.map((h) => "DRA claim " + h.claim + (h.slices > 1 ? " x" + h.slices : "")));
  const title = "MIG " + pool.profile + " (" + gib(pool.memoryMib) + " each): " + pool.held + " of " + pool.advertised +
    " held" + (holders.length ? " by " + holders.join(", ") : "");
  const of = Math.max(pool.advertised, pool.held);
  let bar = "";
  for (const h of pool.pods) {
    bar += '<span class="seg" style="width:' + pct(h.slices, of).toFixed(2) +
      "%;background:" + colour(h.pod) + '" title="' + esc(h.pod + ": " + h.slices + " slice(s)") + '"></span>';
  }
  for (const h of claims) {
    bar += '<span class="seg claim" style="width:' + pct(h.slices, of).toFixed(2) +
      "%;background-color:" + colour(h.claim) + '" title="' + esc("DRA claim " + h.claim + ": " + h.slices + " slice(s)") + '"></span>';
  }
  return '<div class="gpu mig' + (pool.held > pool.advertised ? " unhealthy" : "") + '" data-mig-profile="' + esc(pool.profile) +
    '" data-mig-held="' + pool.held + '" data-mig-advertised="' + pool.advertised + '" data-mig-pods="' +
    esc(pool.pods.map((h) => h.pod).join(" ")) + '" data-mig-claims="' + esc(claims.map((h) => h.claim).join(" ")) + '" title="' + esc(title) + '"><div class="gpu-head"><span>MIG ' + esc(pool.profile) +
    "</span><span>" + pool.held + "/" + pool.advertised + '</span></div><div class="bar mem">' + bar + "</div></div>";
}

function filters() {
  return { model: $("f-model").value, mode: $("f-mode").value, namespace: $("f-namespace").value };
}

function fillSelect(select, values) {
  const chosen = select.value;
  const wanted = ["", ...[...values].sort()];
  const have = [...select.options].map((o) => o.value);
  if (wanted.join("\n") !== have.join("\n")) {
    select.innerHTML = wanted.map((v) => '<option value="' + esc(v) + '">' + (v === "" ? "all" : esc(v)) + "</option>").join("");
  }
  select.value = wanted.includes(chosen) ? chosen : "";
}

function stat(label, value, key) {
  return '<div class="stat" data-total="' + key + '"><b>' + esc(value) + "</b>" + esc(label) + "</div>";
}

// What DRA hands out: the counts, the nodes offered both ways, the slices' problems, the claims.
function draHtml(dra, f) {
  const c = dra.counts;
  const parts = ['<p class="muted">' + (dra.served ? "" : '<span class="bad">the API server does not serve resource.k8s.io/v1 to the extender: DRA GPUs are not read</span> · ') +
    c.gpus + " GPUs and " + c.migSlices + " MIG slices in " + c.slices + " ResourceSlices · " + c.claimsAllocated + " claims allocated</p>"];
  for (const node of dra.nodesOfferedBothWays || []) {
    parts.push('<p class="bad" data-both-ways="' + esc(node) + '">node ' + esc(node) +
      " offers its GPUs both through the device plugin and a DRA driver: run a node's GPUs one way</p>");
  }
  for (const problem of dra.problems || []) parts.push('<p class="bad" data-problem>' + esc(problem) + "</p>");
  const rows = [];
  for (const claim of dra.claims || []) {
    if (f.namespace && namespaceOf(claim.claim) !== f.namespace) continue;
    rows.push('<tr data-claim="' + esc(claim.claim) + '"><td>' + esc(claim.claim) + "</td><td>" + esc(claim.node || "") + "</td><td>" +
      esc(claim.gpus.join(", ")) + "</td><td>" + esc(claim.pods.join(", ")) + "</td><td>" + esc(claim.devices.join(", ")) +
      '</td><td class="bad">' + esc((claim.problems || []).join("; ")) + "</td></tr>");
  }
  parts.push("<table><thead><tr><th>Claim</th><th>Node</th><th>GPUs</th><th>Pods</th><th>Devices</th><th>Problems</th></tr></thead><tbody>" +
    (rows.join("") || '<tr><td colspan="6" class="muted">none</td></tr>') + "</tbody></table>");
  return parts.join("");
}

function render() {
  if (!last) return;
  const started = performance.now();
  const view = last, t = view.totals, f = filters();
  const models = new Set(), modes = new Set(), namespaces = new Set();
  for (const node of view.nodes) {
    modes.add(node.mode);
    for (const gpu of node.gpus) {
      models.add(gpu.model);
      for (const p of gpu.pods) namespaces.add(namespaceOf(p));
      for (const held of gpu.claims || []) namespaces.add(namespaceOf(held.claim));
    }
    for (const pool of node.mig || []) {
      for (const h of pool.pods) namespaces.add(namespaceOf(h.pod));
      for (const h of pool.claims || []) namespaces.add(namespaceOf(h.claim));
    }
  }
  for (const p of view.pending) namespaces.add(namespaceOf(p.pod));
  fillSelect($("f-model"), models); fillSelect($("f-mode"), modes); fillSelect($("f-namespace"), namespaces);
  Object.assign(f, filters());

  $("totals").innerHTML =
    stat("GPUs", t.gpus, "gpus") +
    stat("GPU memory allocated", gib(t.gpuMemoryAllocatedMib) + " / " + gib(t.gpuMemoryMib), "memory") +
    stat("compute allocated (GPUs)", t.gpuComputeAllocated.toFixed(2), "compute") +
    stat("free (GPUs, healthy)", (t.freeMilli / 1000).toFixed(2), "free") +
    stat("stranded fragments (" + view.policy + " measure, GPUs)", (t.fragmentedMilli / 1000).toFixed(2), "fragmented") +
    stat("idle GPUs", t.idleGpus, "idle") +
    stat("idle GPU nodes", t.idleGpuNodes, "idle-nodes") +
    stat("unhealthy GPUs", t.unhealthyGpus, "unhealthy") +
    (view.dra ? stat("GPUs held by DRA claims", t.claimedGpus, "claimed") : "") +
    (t.migSlices ? stat("MIG slices held", t.migSlicesHeld + " / " + t.migSlices, "mig") : "") +
    stat("pending GPU pods", view.pending.length + view.pendingUnexplained, "pending");

  const rows = [];
  for (const p of view.pending) {
    if (f.namespace && namespaceOf(p.pod) !== f.namespace) continue;
    const why = p.fits > 0 ? "fits " + p.fits + " node(s) now: waits for kube-scheduler's next try" :
      p.refusals.map((r) => r.reason + " on " + r.nodes + " node(s)").join(", ") + (p.closest ? "; closest " + p.closest : "");
    rows.push('<tr data-pod="' + esc(p.pod) + '"><td>' + esc(p.pod) + "</td><td>" + esc(p.request) + "</td><td>" +
      p.fits + "</td><td>" + esc(why) + "</td><td>" + esc(p.scheduler || "") + "</td></tr>");
  }
  $("pending").tBodies[0].innerHTML = rows.join("") || '<tr><td colspan="5" class="muted">none</td></tr>';
  $("pending-count").textContent = "(" + rows.length + (view.pendingUnexplained ? ", " + view.pendingUnexplained + " more not explained" : "") + ")";

  $("dra").hidden = !view.dra;
  $("dra-body").innerHTML = view.dra ? draHtml(view.dra, f) : "";

  const html = [];
  let shown = 0;
  for (const node of view.nodes) {
    const model = nodeModel(node);
    if (f.mode && node.mode !== f.mode) continue;
    if (f.model && !node.gpus.some((g) => g.model === f.model)) continue;
    if (f.namespace && !node.gpus.some((g) => g.pods.some((p) => namespaceOf(p) === f.namespace) ||
      (g.claims || []).some((held) => namespaceOf(held.claim) === f.namespace)) &&
      !(node.mig || []).some((pool) => pool.pods.some((h) => namespaceOf(h.pod) === f.namespace) ||
        (pool.claims || []).some((h) => namespaceOf(h.claim) === f.namespace))) continue;
    shown++;
    html.push('<div class="node" data-node="' + esc(node.name) + '" data-mode="' + esc(node.mode) + '" data-model="' +
      esc(model) + '"><div class="node-name" title="' + esc(node.name) + '">' + esc(node.name) + "<small>" + esc(model) +
      " · " + esc(node.mode) + " · " + node.pods + ' pod(s)</small></div><div class="gpus">' +
      node.gpus.map(gpuHtml).join("") + (node.mig || []).map(migHtml).join("") + "</div></div>");
  }
  $("nodes").innerHTML = html.join("");
  $("node-count").textContent = "(" + shown + " of " + view.nodes.length + ")";
  const took = performance.now() - started;
  $("status").textContent = "updated " + new Date().toLocaleTimeString() + " · drawn in " + took.toFixed(0) + " ms · every " + POLL_MS / 1000 + " s";
  document.body.dataset.ready = "true";
  document.body.dataset.drawMs = took.toFixed(1);
  document.body.dataset.draws = String(Number(document.body.dataset.draws || 0) + 1);
}

async function poll() {
  clearTimeout(timer);
  const asked = performance.now();
  try {
    const response = await fetch(dataUrl, { headers: token ? { Authorization: "Bearer " + token } : {}, cache: "no-store" });
    if (response.status === 401 || response.status === 403) {
      $("login").hidden = false;
      $("login-error").textContent = (await response.text()).trim();
      $("status").textContent = "needs a token";
    } else if (!response.ok) {
      $("status").textContent = "error " + response.status + ": " + (await response.text()).trim();
    } else {
      $("login").hidden = true;
      const text = await response.text();
      document.body.dataset.fetchMs = (performance.now() - asked).toFixed(1);
      document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
      // An unchanged answer is not drawn again: a steady cluster costs one fetch per poll.
      if (text !== lastText) {
        lastText = text;
        last = JSON.parse(text);
        render();
      }
    }
  } catch (error) {
    $("status").textContent = "cannot reach the extender: " + error;
  }
  timer = setTimeout(poll, POLL_MS);
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("gpu-extender-token", token);
  poll();
});
for (const id of ["f-model", "f-mode", "f-namespace"]) $(id).addEventListener("change", render);
poll();
