"use strict";
const $ = (id) => document.getElementById(id);
// the key may come in the address' fragment (#key=...), which browsers never send to a server;
// one that differs from the key this browser keeps replaces it only when the user says so (a
// link someone else sent must not switch, unseen, the tenant this page acts for)
const fragment = new URLSearchParams(location.hash.slice(1));
const offered = fragment.get("key"), stored = localStorage.getItem("setflow-key") || "";
let key = stored;
if (offered !== null) {
  history.replaceState(null, "", "/");
  if (!stored || offered === stored || confirm("This link carries an API key other than the one this browser " +
      "keeps. Use the link's key from now on (the stored one is replaced)?")) {
    key = offered;
    localStorage.setItem("setflow-key", offered);
  }
}
$("key").value = key;
$("key").addEventListener("change", () => localStorage.setItem("setflow-key", $("key").value));
const headers = () => ({"Authorization": "Bearer " + $("key").value, "Content-Type": "application/json"});

const SAMPLES = {
  narrative: {kind: "narrative", spec: {payload: {tenant: "Northwind", period: "2026-Q3", style: "formal",
    metrics: [{key: "revenue", value: "1240", prev: "1105", target: "1300"}, {key: "churn", value: "2.4", prev: "2.6"}]}}},
  agent: {kind: "agent", spec: {question: "By how much did revenue in EMEA change from 2026-Q2 to 2026-Q3, in percent?"}},
  report: {kind: "report", spec: {title: "Quarterly review", data: {tenant: "Northwind", period: "2026-Q3", style: "formal",
    metrics: [{key: "revenue", value: "1240", prev: "1105", target: "1300"}, {key: "churn", value: "2.4", prev: "2.6"},
              {key: "latency", value: "182", prev: "190"}]},
    outline: [{title: "Revenue", metrics: ["revenue"]}, {title: "Customer health", metrics: ["churn"]},
              {title: "Platform performance", metrics: ["latency"]}]}},
};

// the notice area: what the page did last, or the API's error (code: message), never swallowed
function say(text) { $("notice").textContent = text; $("notice").classList.remove("error"); }
function fail(e) {
  $("notice").textContent = e instanceof Error ? e.message : String(e);
  $("notice").classList.add("error");
}

async function api(method, path, body) {
  const r = await fetch(path, {method, headers: headers(), body: body ? JSON.stringify(body) : undefined});
  const data = r.status === 204 ? null : await r.json().catch(() => null);
  if (!r.ok) {
    const err = new Error(data && data.error ? data.error.code + ": " + data.error.message : "HTTP " + r.status + " " + r.statusText);
    err.code = data && data.error ? data.error.code : String(r.status);
    throw err;
  }
  return data;
}

const short = (id) => id ? id.slice(0, 8) : "—";
// the API's times are UTC; a database without time zones (SQLite) gives them without one
const utc = (iso) => /(Z|[+-]\d\d:?\d\d)$/.test(iso) ? iso : iso + "Z";
const when = (iso) => iso ? new Date(utc(iso)).toLocaleTimeString() : "—";
function el(tag, props, ...children) {  // a DOM element: props are properties, "data-*" attributes, or "class"
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null) continue;
    if (k.startsWith("data-") || k === "class" || k === "title") e.setAttribute(k, v); else e[k] = v;
  }
  e.append(...children.filter((c) => c !== null && c !== undefined));
  return e;
}

for (const kind of Object.keys(SAMPLES)) {
  $("run-" + kind).addEventListener("click", async () => {
    say("submitting a " + kind + " job ...");
    const body = structuredClone(SAMPLES[kind]);
    if (kind === "agent" && $("client-metric").checked) body.spec.client_tools = ["metric"];
    try {
      const job = await api("POST", "/v1/jobs", body);
      say("queued " + kind + " job " + job.id);
      watch(job.id);
      refresh();
    } catch (e) { fail(e); }
  });
}

function progressOf(j) {
  const p = j.progress || {};
  if (j.status === "succeeded") return 1;
  if (p.sections) return p.section / p.sections;
  if (j.status === "running" || j.status === "requires_action") return 0.5;  // waiting on its client, part done
  return 0;
}

async function refresh() {
  if (!$("key").value) return;
  try {
    const {jobs} = await api("GET", "/v1/jobs?limit=15");
    $("jobs").replaceChildren(...jobs.map((j) => {
      const tr = document.createElement("tr");
      tr.className = "job" + (j.id === watched ? " watched" : "");
      tr.dataset.id = j.id;
      const p = progressOf(j);
      const label = j.progress && j.progress.sections ? ` ${j.progress.section}/${j.progress.sections}` : "";
      tr.innerHTML = `<td>${j.id.slice(0, 8)}</td><td>${j.kind}</td><td class="${j.status}">${j.status}</td>` +
        `<td><div class="bar"><div style="width:${Math.round(p * 100)}%"></div></div>${label}</td>`;
      tr.addEventListener("click", () => watch(j.id));
      return tr;
    }));
    const w = jobs.find((j) => j.id === watched);
    if (w) pendingFromJob(w);
  } catch (e) { fail(e); }
  refreshSessions();
}

let watched = null, controller = null;
async function watch(id) {
  if (controller) controller.abort();
  controller = new AbortController();
  watched = id;
  clearPending();
  $("watching").textContent = "job " + id.slice(0, 8);
  $("canvas").replaceChildren();
  $("canvas").dataset.steps = "0";  // step events received (a step commits a set of tokens)
  $("final").textContent = "";
  $("report").hidden = true;
  $("report-frame").srcdoc = "";
  $("status").textContent = "";
  $("status").className = "";
  $("status").dataset.status = "";  // set by the result event only (the job's last word)
  $("status").dataset.live = "";  // the latest status event (queued, running, requires_action, ...)
  $("status").dataset.session = "";
  $("status").dataset.job = id;  // which job the status is of
  $("open-session").hidden = true;
  const turns = {};  // job step -> {el, slots: pos -> span}
  const signal = controller.signal;
  let lastId = null, finished = false;
  while (!finished && !signal.aborted) {  // a dropped stream resumes after the last event seen
    try {
      const h = headers();
      if (lastId) h["Last-Event-ID"] = lastId;
      const r = await fetch(`/v1/jobs/${id}/events`, {headers: h, signal});
      if (r.status === 204) return;  // a finished job whose events were all read
      if (!r.ok && r.status !== 429 && r.status < 500) {  // a bad key, a job gone: say so, no retry
        const body = await r.json().catch(() => null);
        fail(body && body.error ? body.error.code + ": " + body.error.message : "HTTP " + r.status);
        return;
      }
      if (!r.ok) throw new Error("events: HTTP " + r.status);
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += decoder.decode(value, {stream: true});
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
          let event = "message", data = "", eid = null;
          for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) event = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
            else if (line.startsWith("id: ")) eid = line.slice(4);
          }
          if (eid) lastId = eid;
          if (data && id === watched) onEvent(event, JSON.parse(data), turns);
          if (event === "result") finished = true;
        }
      }
    } catch (e) {
      if (signal.aborted) return;
      fail(String(e.message || e) + " (reconnecting)");
    }
    if (!finished && !signal.aborted) await new Promise((ok) => setTimeout(ok, 1000));
  }
}

function onEvent(event, ev, turns) {
  if (event === "step") {
    $("canvas").dataset.steps = String(Number($("canvas").dataset.steps || 0) + 1);
    let t = turns[ev.turn];
    if (!t) {
      const head = document.createElement("span");
      head.className = "turn"; head.textContent = "turn " + (ev.turn + 1);
      const el = document.createElement("span");
      $("canvas").append(head, el);
      t = turns[ev.turn] = {el, slots: new Map(), lo: Infinity, hi: -1};
    }
    if (ev.cut !== null && ev.cut !== undefined) {  // a stop fired: positions >= cut are gone
      for (const [pos, span] of t.slots) if (pos >= ev.cut) { span.remove(); t.slots.delete(pos); }
      t.hi = Math.min(t.hi, ev.cut - 1);
    }
    ev.positions.forEach((pos, i) => {
      t.lo = Math.min(t.lo, pos); t.hi = Math.max(t.hi, pos);
      const span = document.createElement("span");
      span.className = "tok new"; span.textContent = ev.pieces ? ev.pieces[i] : "#" + ev.tokens[i];
      span.dataset.pos = pos;
      t.slots.set(pos, span);
      setTimeout(() => span.classList.remove("new"), 600);
    });
    render(t);
  } else if (event === "progress" && ev.sections) {
    $("watching").textContent = `job ${watched.slice(0, 8)}: section ${ev.section}/${ev.sections}`;
  } else if (event === "status") {
    $("status").dataset.live = ev.status;
    if (!$("status").dataset.status) { $("status").textContent = ev.status; $("status").className = ev.status; }
    if (ev.status === "requires_action") showPending(watched, ev.calls || [], ev.deadline);
    else clearPending();  // queued or running again (answered), or ended
  } else if (event === "result") {
    const res = ev.result || {};
    clearPending();
    $("status").textContent = ev.status;
    $("status").className = ev.status;
    $("final").textContent = res.markdown || res.text || (ev.error ? ev.error.message : "");
    showReport(ev);
    $("status").dataset.session = ev.session || "";
    $("open-session").hidden = !ev.session;
    $("status").dataset.status = ev.status;
    refresh();
    if (ev.session && ev.session === openSession) showSession(ev.session);  // its new turn(s)
  }
}

// a succeeded narrative or report: its export page (the charts as SVG, the main drivers) under the
// text, in a frame where no script runs, and its downloads (fetched with the key, saved as a file)
async function showReport(job) {
  if (job.status !== "succeeded" || !["narrative", "report"].includes(job.kind)) return;
  try {
    const r = await fetch(`/v1/jobs/${job.id}/report.html`, {headers: headers()});
    if (!r.ok) throw new Error(`report: HTTP ${r.status}`);
    const page = await r.text();
    if (job.id !== watched) return;
    $("report-frame").onload = () => {  // as tall as the page it shows (same origin: the sandbox lets us read it)
      const doc = $("report-frame").contentDocument;
      if (doc && doc.body) $("report-frame").style.height = Math.min(1400, doc.documentElement.scrollHeight + 4) + "px";
    };
    $("report-frame").srcdoc = page;
    $("report").dataset.job = job.id;
    $("report").hidden = false;
  } catch (e) { fail(e); }
}
for (const b of document.querySelectorAll("#report button[data-fmt]")) {
  b.addEventListener("click", async () => {
    const id = $("report").dataset.job, fmt = b.dataset.fmt;
    try {
      const r = await fetch(`/v1/jobs/${id}/report.${fmt}`, {headers: headers()});
      if (!r.ok) throw new Error(`report.${fmt}: HTTP ${r.status}`);
      const name = (/filename="([^"]+)"/.exec(r.headers.get("Content-Disposition") || "") || [])[1] || `report.${fmt}`;
      const a = el("a", {href: URL.createObjectURL(await r.blob()), download: name});
      a.click();
      setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
    } catch (e) { fail(e); }
  });
}

function render(t) {  // every position from the first to the last seen: decoded, or a hole
  const out = [];
  for (let p = t.lo; p <= t.hi; p++) {
    if (t.slots.has(p)) out.push(t.slots.get(p));
    else { const h = document.createElement("span"); h.className = "hole"; h.textContent = "·"; out.push(h); }
  }
  t.el.replaceChildren(...out);
}

// ---- pending tool calls: a job in requires_action waits for this page to run its client tools ----
let pendingJob = null, resumedAt = 0;
const deadlineMs = (d) => d === null || d === undefined ? null : typeof d === "number" ? d * 1000 : Date.parse(d);

function showPending(job, calls, deadline) {
  const at = deadlineMs(deadline);
  const shown = [...$("pending-calls").children].map((c) => c.dataset.call).join(",");
  if (pendingJob === job && shown === calls.map((c) => c.id).join(",")) return;  // the same wait, already shown
  pendingJob = job;
  $("pending").dataset.job = job;
  $("pending-calls").replaceChildren(...calls.map((c) => {
    const args = Object.entries(c.arguments || {}).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ");
    const input = el("input", {type: "text", placeholder: "output", "data-output": c.id});
    const send = el("button", {textContent: "send", "data-send": c.id});
    const err = el("span", {class: "err", "data-error": c.id});
    const submit = () => sendOutput(job, c.id, input, send, err);
    send.addEventListener("click", submit);
    input.addEventListener("keydown", (e) => { if (e.key === "Enter") submit(); });
    return el("div", {class: "call", "data-call": c.id, "data-tool": c.tool},
      el("b", {textContent: c.tool}), el("code", {textContent: c.call || `${c.tool}(${args})`}),
      el("span", {class: "muted", textContent: args}),
      el("span", {class: "muted", "data-deadline": at === null ? "" : String(at),
                  textContent: at === null ? "no deadline" : ""}),
      input, send, err);
  }));
  $("pending").hidden = calls.length === 0;
  tickDeadlines();
  const first = $("pending-calls").querySelector("input");
  if (first) first.focus();
}

function clearPending() {
  pendingJob = null;
  $("pending").hidden = true;
  $("pending").dataset.job = "";
  $("pending-calls").replaceChildren();
}

function pendingFromJob(j) {  // the job view's required_action: the events may have been lost (Redis is best effort)
  if (j.status !== "requires_action" || !j.required_action || Date.now() - resumedAt < 3000) return;
  if (!$("pending").hidden && pendingJob === j.id) return;
  showPending(j.id, j.required_action.calls || [], j.required_action.deadline);
}

async function sendOutput(job, callId, input, button, err) {
  button.disabled = true;
  err.textContent = "";
  say(`sending the output of ${callId}…`);  // a refusal shown before is not this answer's
  try {
    const j = await api("POST", `/v1/jobs/${job}/tool_outputs`, {tool_outputs: [{call_id: callId, output: input.value.trim()}]});
    resumedAt = Date.now();
    say(`sent the output of ${callId} to job ${short(job)}: ${j.status}`);
    const row = $("pending-calls").querySelector(`[data-call="${CSS.escape(callId)}"]`);
    if (row) row.remove();
    if (!$("pending-calls").children.length) clearPending();
  } catch (e) {
    err.textContent = e.message;
    fail(`tool output for ${callId} refused: ${e.message}`);
  } finally { button.disabled = false; }
}

function tickDeadlines() {
  for (const s of document.querySelectorAll("#pending [data-deadline]")) {
    if (!s.dataset.deadline) continue;
    const at = Number(s.dataset.deadline), left = Math.round((at - Date.now()) / 1000);
    s.textContent = "answer by " + new Date(at).toLocaleTimeString() + (left > 0 ? ` (${left} s left)` : " (passed)");
  }
}
