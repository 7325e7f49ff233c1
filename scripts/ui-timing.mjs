// Times the web view in headless Chromium over the DevTools protocol: page ready (navigation to
// the first drawing of /ui/data) and the cost of each later poll (the fetch; a redraw only when the
// answer changed), as the
// page itself reports them in its body's data attributes. A measurement aid, not part of
// `make test`; docs/benchmarks.md ("Web view") says how it was run.
//   node --experimental-websocket scripts/ui-timing.mjs http://127.0.0.1:9191/ui [devtools-port]
import { spawn } from "node:child_process";

const url = process.argv[2];
const port = Number(process.argv[3] || 9333);
if (!url) { console.error("usage: ui-timing.mjs URL [devtools-port]"); process.exit(2); }
const chromium = spawn("chromium", ["--headless", "--no-sandbox", "--disable-gpu",
  `--remote-debugging-port=${port}`, "about:blank"], { stdio: "ignore" });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
try {
  let targets;
  for (let i = 0; i < 100 && !targets; i++) {
    try { targets = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json(); } catch { await sleep(100); }
  }
  const page = targets.find((t) => t.type === "page");
  const ws = new WebSocket(page.webSocketDebuggerUrl);
  await new Promise((r) => ws.addEventListener("open", r));
  let id = 0; const waiting = new Map();
  ws.addEventListener("message", (m) => { const msg = JSON.parse(m.data); if (waiting.has(msg.id)) { waiting.get(msg.id)(msg); waiting.delete(msg.id); } });
  const call = (method, params = {}) => new Promise((r) => { waiting.set(++id, r); ws.send(JSON.stringify({ id, method, params })); });
  const body = async () => (await call("Runtime.evaluate", { expression: "JSON.stringify(document.body ? document.body.dataset : {})", returnByValue: true })).result.result.value;
  const started = performance.now();
  await call("Page.navigate", { url });
  let data = {};
  while (!JSON.parse((data = await body()) || "{}").ready) await sleep(20);
  console.log(`page ready in ${(performance.now() - started).toFixed(0)} ms: ${data}`);
  // The page polls every 5 s and draws again only when the answer changed.
  for (let polls = 1; polls < 4; ) {
    const now = JSON.parse(await body());
    if (Number(now.polls) > polls) { polls = Number(now.polls); console.log(`poll ${polls}: fetch ${now.fetchMs} ms, draws so far ${now.draws} (last ${now.drawMs} ms)`); }
    await sleep(50);
  }
  ws.close();
} finally {
  chromium.kill();
}
