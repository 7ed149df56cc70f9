// The instructor's dashboard: polls /dashboard/stats (admin key) every two seconds and redraws.
// Students appear by the names of the key file, never by their keys.
"use strict";

const $ = (id) => document.getElementById(id);
const keyStore = kinetic.keyStore("kinetic.adminKey");
const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.append(td);
  return td;
}

function mark(done) {
  return done ? "✓" : "–";
}

function ago(iso) {
  if (!iso) return "–";
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  return seconds < 60 ? `${seconds} s ago` : `${Math.floor(seconds / 60)} min ago`;
}

function drawSlots(slots, models) {
  const rows = slots.map((slot) => {
    const row = document.createElement("tr");
    row.dataset.slot = slot.id;
    row.className = slot.state;
    cell(row, models.length > 1 ? `${slot.model} #${slot.id}` : slot.id); // router mode: which model's slot
    cell(row, slot.state);
    cell(row, slot.key ?? "");
    cell(row, slot.n_prompt_tokens);
    cell(row, slot.n_prompt_tokens_cache);
    cell(row, slot.n_decoded);
    return row;
  });
  $("slots").tBodies[0].replaceChildren(...rows);
}

function percent(share) {
  return share === null ? "–" : `${Math.round(share * 100)} %`;
}

function drawUpstreams(upstreams) {
  $("upstreams-card").hidden = upstreams.length === 0;
  const rows = upstreams.map((u) => {
    const row = document.createElement("tr");
    row.dataset.url = u.url;
    row.className = u.state;
    cell(row, u.model);
    cell(row, u.url);
    cell(row, u.state, u.state === "down" ? "bad" : "");
    cell(row, u.load);
    cell(row, u.served);
    cell(row, u.served ? percent(u.affine / u.served) : "–");
    cell(row, percent(u.cache_hit_rate));
    return row;
  });
  $("upstreams").tBodies[0].replaceChildren(...rows);
}

function drawQueue(queue, totals) {
  const cap = queue.max_queue ? ` (at most ${queue.max_queue} a model, --max-queue)` : "";
  $("queue").textContent = `${queue.processing} processing, ${queue.deferred} waiting${cap}`;
  $("queue-by-key").replaceChildren(...Object.entries(queue.deferred_by_key).map(([name, count]) => {
    const li = document.createElement("li");
    li.textContent = `${name}: ${count} waiting`;
    return li;
  }));
  $("totals").textContent = `${totals.requests} requests, ${totals.prompt_tokens} tokens in, ` +
    `${totals.completion_tokens} tokens out, ${totals.errors} errors`;
}

function drawStudents(students) {
  const rows = students.map((s) => {
    const row = document.createElement("tr");
    row.dataset.name = s.name;
    if (s.requests === 0) row.className = "silent";
    cell(row, s.name, "name");
    cell(row, s.requests, "requests");
    cell(row, s.prompt_tokens, "tokens-in");
    cell(row, s.completion_tokens, "tokens-out");
    cell(row, s.errors, s.errors ? "errors bad" : "errors");
    cell(row, s.mean_ttft_s === null ? "–" : `${Math.round(s.mean_ttft_s * 1000)} ms`, "ttft");
    const last = cell(row, s.last ? `${s.last.route} ${s.last.status}, ${ago(s.last.time)}` : "–", "last");
    if (s.last) last.title = s.last.time;
    cell(row, mark(s.lab.streamed_chat), "streamed-chat");
    cell(row, mark(s.lab.full_chat), "full-chat");
    cell(row, s.lab.rejected_401 ? `✓ ${s.lab.rejected_401}` : "–", "rejected");
    return row;
  });
  $("students").tBodies[0].replaceChildren(...rows);
}

// A line of tokens/s per time bucket, drawn in SVG by hand: no chart library, works offline.
function drawChart(points) {
  const svg = $("chart");
  const width = 600, top = 4, bottom = 138;
  const max = Math.max(1, ...points.map((p) => p.tokens_per_s));
  const x = (i) => (points.length > 1 ? (i / (points.length - 1)) * width : 0);
  const y = (v) => bottom - (v / max) * (bottom - top);
  const line = points.map((p, i) => `${x(i).toFixed(1)},${y(p.tokens_per_s).toFixed(1)}`).join(" ");
  const make = (tag, attrs, text) => {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  };
  svg.replaceChildren(
    make("line", { x1: 0, y1: bottom, x2: width, y2: bottom, class: "axis" }),
    make("polygon", { points: `0,${bottom} ${line} ${width},${bottom}`, class: "area" }),
    make("polyline", { points: line, class: "rate" }),
  );
  $("chart-max").textContent = `${max.toFixed(1)} tokens/s`;
  const recent = points.slice(-6).reduce((sum, p) => sum + p.tokens_per_s, 0) / Math.min(6, points.length || 1);
  $("rate-now").textContent = `(last 30 s: ${recent.toFixed(1)} tokens/s)`;
}

// What the OpenAI surface keeps for the students, and where (a file survives a restart, memory does not).
function drawStore(store) {
  const counts = ["responses", "conversations", "files", "batches"].map((name) => `${store[name] ?? 0} ${name}`);
  $("store").textContent = `${counts.join(", ")} · ${(store.bytes / 2 ** 20).toFixed(1)} MiB in ${store.where}`;
}

async function poll() {
  const config = await (await fetch("/ui/config.json")).json();
  if (config.admin_key_required && !keyStore.get()) {
    await kinetic.askKey($("key-form"), keyStore, "The dashboard needs an admin key.");
  }
  for (;;) {
    let res;
    try {
      res = await fetch("/dashboard/stats", { headers: kinetic.headers(keyStore.get()) });
    } catch (error) {
      $("status").textContent = `server unreachable (${error.message})`;
      await kinetic.sleep(POLL_MS);
      continue;
    }
    if (res.status === 401 || res.status === 403) {
      const message = await kinetic.errorText(res);
      keyStore.clear();
      $("board").hidden = true;
      $("status").textContent = "needs an admin key";
      await kinetic.askKey($("key-form"), keyStore, message);
      continue;
    }
    if (!res.ok) {
      $("status").textContent = res.status === 503 ? "loading the model…" : await kinetic.errorText(res);
      await kinetic.sleep(POLL_MS);
      continue;
    }
    const stats = await res.json();
    $("board").hidden = false;
    $("model").textContent = stats.models.map((m) => m.name).join(", ") || "no model loaded";
    $("ctx").textContent = stats.models.length ? `n_ctx ${stats.models[0].n_ctx}` : "";
    drawSlots(stats.slots, stats.models);
    drawUpstreams(stats.upstreams);
    drawQueue(stats.queue, stats.totals);
    drawStudents(stats.students);
    drawChart(stats.throughput);
    drawStore(stats.store);
    // --ledger: why the class record cannot be written (requests get 503 until it can), said first
    const ledgerProblem = stats.ledger && stats.ledger !== "ok" ? stats.ledger : "";
    $("ledger-alert").hidden = !ledgerProblem;
    $("ledger-alert").textContent = ledgerProblem;
    $("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
    await kinetic.sleep(POLL_MS);
  }
}

poll();
