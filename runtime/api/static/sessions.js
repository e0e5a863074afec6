"use strict";
// the page's sessions view (page.js holds the rest; both are classic scripts sharing one global scope)
// ---- sessions: the list, a session's transcript and K/V cache, a follow-up turn, fork, delete ----
let openSession = null, sessionSeq = 0, listed = "";
const jobResults = new Map();  // finished job id -> its result (per-turn costs)

async function refreshSessions(force) {
  if (!$("key").value) return;
  try {
    const {sessions} = await api("GET", "/v1/sessions?limit=30");
    const key = sessions.map((x) => x.id).join(",") + "|" + openSession;
    if (key === listed && !force) return;  // unchanged: leave the rows (and a click on them) alone
    listed = key;
    $("sessions").replaceChildren(...sessions.map((x) => {
      const tr = el("tr", {class: "session" + (x.id === openSession ? " open" : ""), "data-session": x.id, title: x.id},
        el("td", {textContent: short(x.id)}), el("td", {textContent: when(x.created_at)}));
      tr.addEventListener("click", () => showSession(x.id));
      return tr;
    }));
  } catch (e) { fail(e); }
}
$("refresh-sessions").addEventListener("click", () => refreshSessions(true));

// per-turn costs from a job's result: any object with a numeric `turn` and load_ms/decode_ms (agent
// and report summaries, a narrative's or infill's own) or costs in seconds (a turn job's)
function turnCosts(result, out = new Map()) {
  if (!result || typeof result !== "object") return out;
  if (Array.isArray(result)) { result.forEach((x) => turnCosts(x, out)); return out; }
  if (typeof result.turn === "number") {
    const c = result.costs || {};
    const load = result.load_ms ?? (c.load_s !== undefined ? c.load_s * 1000 : undefined);
    const decode = result.decode_ms ?? (c.decode_s !== undefined ? c.decode_s * 1000 : undefined);
    if (load !== undefined || decode !== undefined) out.set(result.turn, {load, decode, nfe: result.nfe});
  }
  for (const v of Object.values(result)) if (v && typeof v === "object") turnCosts(v, out);
  return out;
}

async function costsOf(jobIds) {  // job id -> Map(turn -> costs), from the finished jobs' results
  const out = new Map();
  for (const id of jobIds) {
    if (!jobResults.has(id)) {
      let j;
      try { j = await api("GET", `/v1/jobs/${id}`); } catch (e) {  // the transcript still shows; the error too
        fail(`job ${short(id)} of this session: ${e.message}`);
        out.set(id, new Map());
        continue;
      }
      if (!["succeeded", "failed", "cancelled"].includes(j.status)) { out.set(id, new Map()); continue; }
      jobResults.set(id, turnCosts(j.result));
    }
    out.set(id, jobResults.get(id));
  }
  return out;
}

const ms = (x) => x === undefined || x === null ? null : (x < 10 ? x.toFixed(2) : x.toFixed(0)) + " ms";

async function showSession(id) {
  const seq = ++sessionSeq;
  try {
    const s = await api("GET", `/v1/sessions/${id}`);
    const costs = await costsOf([...new Set(s.turns.map((t) => t.job).filter(Boolean))]);
    if (seq !== sessionSeq) return;  // another session was opened meanwhile
    openSession = id;
    $("session-view").hidden = false;
    $("session-view").dataset.session = id;
    $("session-view").dataset.turns = String(s.turns.length);
    $("session-id").textContent = id + " · created " + when(s.created_at) +
      (s.unfinished_jobs ? ` · ${s.unfinished_jobs} unfinished job(s)` : "");
    const kv = s.kv;
    $("kv").textContent = (kv.redis_turns === null ? "no K/V state in Redis (its next turn recomputes from SQL)"
        : `K/V in Redis: ${kv.redis_turns} turn(s), ${(kv.redis_bytes / 1024).toFixed(1)} KiB in ${kv.redis_segments} ` +
          `segment(s), ${kv.slots} slots`) +
      (kv.last_worker ? ` · last worker ${kv.last_worker} (${kv.last_worker_alive ? "alive" : "gone"})` : " · no worker yet");
    $("transcript").replaceChildren(...(s.turns.length ? s.turns.map((t) => {
      const c = t.job && costs.has(t.job) ? costs.get(t.job).get(t.index) : null;
      const fork = el("button", {id: "fork-" + t.index, textContent: "fork here", title: `a new session of turns 0..${t.index}`});
      fork.addEventListener("click", () => forkAt(id, t.index));
      const job = t.job ? el("a", {class: "job", textContent: "job " + short(t.job), title: t.job}) :
        el("span", {class: "muted", textContent: "no job (a fork's copy)"});
      if (t.job) job.addEventListener("click", () => watch(t.job));
      const timing = c ? [ms(c.load) && "load " + ms(c.load), ms(c.decode) && "decode " + ms(c.decode),
                          c.nfe ? c.nfe + " nfe" : null].filter(Boolean).join(" · ") : "";
      return el("div", {class: "turn-card", "data-turn": String(t.index), "data-path": t.path || ""},
        el("div", {class: "head"},
          el("b", {textContent: "turn " + t.index}), el("span", {textContent: t.role}),
          el("span", {class: "path " + (t.path || ""), textContent: t.path || "—",
                      title: "how the session was resumed for this turn"}),
          el("span", {class: "muted", textContent: t.tokens + " tokens"}),
          timing ? el("span", {class: "timing", textContent: timing}) : null,
          job, el("span", {class: "muted", textContent: when(t.created_at)}), fork),
        el("div", {class: "txt in", "data-label": "in", textContent: t.input}),
        el("div", {class: "txt out", "data-label": "out", textContent: t.output}));
    }) : [el("p", {class: "muted", textContent: "no turns yet"})]));
    refreshSessions();
  } catch (e) { if (seq === sessionSeq) fail(e); }
}

$("open-session").addEventListener("click", () => { if ($("status").dataset.session) showSession($("status").dataset.session); });
$("refresh-session").addEventListener("click", () => { if (openSession) showSession(openSession); });

async function sendTurn() {
  if (!openSession) return;
  const text = $("follow-up").value;
  const n = Number($("follow-up-tokens").value) || 32;
  try {
    const job = await api("POST", `/v1/sessions/${openSession}/turns`, {text, params: {max_new_tokens: n}});
    say("queued turn job " + job.id);
    $("follow-up").value = "";
    watch(job.id);
    refresh();
  } catch (e) { fail(e); }
}
$("send-turn").addEventListener("click", sendTurn);
$("follow-up").addEventListener("keydown", (e) => { if (e.key === "Enter") sendTurn(); });

async function forkAt(id, turn) {
  try {
    const s = await api("POST", `/v1/sessions/${id}/fork`, {turn});
    say(`forked session ${short(id)} at turn ${turn}: new session ${s.id}`);
    await showSession(s.id);
    refreshSessions(true);
  } catch (e) { fail(e); }
}

$("delete-session").addEventListener("click", async () => {
  const id = openSession;
  if (!id) return;
  try {
    await api("DELETE", `/v1/sessions/${id}`);
    say("deleted session " + id);
    openSession = null;
    sessionSeq++;
    $("session-view").hidden = true;
    $("session-view").dataset.session = "";
    $("transcript").replaceChildren();
    refreshSessions(true);
  } catch (e) { fail(e); }
});

// started once both scripts are in: a refresh reads the sessions too
setInterval(refresh, 1500);
refresh();
setInterval(tickDeadlines, 1000);
