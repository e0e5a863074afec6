"""Where a response continues: a request -> its job, on the session it goes on from.  A
conversation's responses go on in its session; a previous response's chain goes on in that
response's session while it is the latest turn and nothing else runs there, else in a fork at
its last turn (copy on write).  A stateless client that re-sends its history goes on from the
last of our responses it names; a re-sent item must be what that response made.  Past a
compact_threshold a response starts a session of its own over the kept messages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runtime.api.openai import compaction, ids, mapping, view
from runtime.api.openai.request import BuiltinTool, CreateResponse
from runtime.api.services import Services
from runtime.errors import BadInput, NotFound
from runtime.jobs.conversations import Conversations
from runtime.jobs.hosts import Hosts
from runtime.sessions import lifecycle
from runtime.settings import deployment_key
from runtime.tables import TERMINAL, JobRecord

GOING_ON_S = 30  # a request's hold on the session it goes on from (_going_on): past any submit
MAX_CHAIN = 64  # responses _went_on walks back from a call's response to the one a request names


def submit(svc: Services, who: str, req: CreateResponse) -> JobRecord:
    """The request as a job on the session it continues: refused, changing nothing, where it
    does not fit (a conversation and a previous response both; a previous response that has not
    ended, or another tenant's: 404; an output for no waiting call; a setflow_metric tool over a
    dataset the tenant has not: 404, as the native agent's)."""
    for t in req.tools:
        if isinstance(t, BuiltinTool) and t.dataset is not None:
            svc.datasets.exists(who, t.dataset)
    if req.background and not req.store:
        raise BadInput("a background response is kept until it is read: store false cannot be background")
    conv, prev_id = req.conversation_id(), req.previous_response_id
    given = referenced(svc, who, req.items())
    if conv is not None and prev_id is not None:
        raise BadInput("give a conversation or a previous_response_id, not both")
    if conv is not None:
        if not req.store:
            raise BadInput("a conversation keeps its responses: store false is for a response of its own")
        session = ids.session_of(conv)
        convs = Conversations(svc.sql, svc.settings)
        with _going_on(svc, session, conv):
            pending = convs.get(session, who).pending  # NotFound for another tenant's
            done = convs.responses(session)
            prev = done[-1] if done else None
            items = [*pending, *_not_re_read(prev, given)]  # the added items keep their ids: listed the same after
            if prev is not None and prev.status not in TERMINAL:
                raise BadInput(f"the conversation's last response ({ids.response_id(prev.id)}) has not ended")
            done_prev = prev if prev is not None and prev.status == "succeeded" else None
            job = _submit(svc, who, req, mapping.spec(req, items, done_prev, conv), session)
            if pending:
                convs.take(session, who, pending)
            return job
    items, prev = given, None
    if prev_id is None:  # a client that re-sends the history: its last call's response goes on
        prev_id, items = _resent(svc, who, items)
    if prev_id is not None:
        prev = response(svc, ids.job_of(prev_id), who)
        if prev.status != "succeeded":
            raise BadInput(f"previous response {prev_id} is {view.status(prev)}: only a completed one goes on")
        prev = _went_on(svc, who, prev, items)
        items = _after_held(prev, items)
    compacted = _compacted(svc, who, req, prev, items) if prev is not None else None
    if compacted is not None:  # a session of its own, over the kept messages and this input
        items, prev = compaction.as_items(compacted), None
    spec = mapping.spec(req, items, prev, None)  # every check of the request before a fork: a refusal forks nothing
    if compacted is not None:
        spec["request"]["compaction"] = compaction.item(compacted, who, deployment_key(svc.settings))
    if prev is None:
        return _submit(svc, who, req, spec, None)
    with _going_on(svc, prev.session_id, None) as alone:
        session, forked = _at(svc, prev, who, fork=not req.store or not alone)
        try:
            return _submit(svc, who, req, spec, session)
        except Exception:
            if forked:  # refused (a quota, the context, the rate): the fork made for it goes too
                lifecycle.delete_session(svc.store, svc.records, session, who)
            raise


def _compacted(svc: Services, who: str, req: CreateResponse, prev: JobRecord,
               items: list[dict[str, Any]]) -> list[dict[str, str]] | None:
    """Server-side compaction (context_management's compact_threshold): where the session `prev`
    left holds more positions than the threshold (what its last response read and wrote), the
    messages kept of its chain and this input (compaction.kept); the response runs on a session
    of its own over them, and its output begins with the compaction item.  None: it goes on in
    the session as it is (no threshold, not past it, or a call of prev waits for its output:
    its state is the session's)."""
    limit = req.compact_threshold()
    if limit is None or mapping.waiting_calls(prev):
        return None
    usage = (prev.result or {}).get("usage") or {}
    if int(usage.get("input", 0)) + int(usage.get("output", 0)) <= limit:
        return None
    return compaction.kept([*history(svc, who, prev), *items]) or None


def history(svc: Services, who: str, job: JobRecord) -> list[dict[str, Any]]:
    """The items of the chain that ends at `job`: each response's input and output items, the
    first response's first (back MAX_CHAIN responses at most; a deleted one ends it)."""
    chain = [job]
    while len(chain) < MAX_CHAIN and (before := chain[-1].spec.get("previous")) is not None:
        try:
            chain.append(response(svc, before, who))
        except NotFound:
            break
    return [x for j in reversed(chain) for x in [*view.input_items(j), *view.output_items(j)]]


def referenced(svc: Services, who: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items with each item_reference read as the item it names: an output item of one of
    the tenant's responses (msg_, fc_) or an input item (in_), as a client would re-send it;
    and each compaction item as the messages it keeps (compaction.expanded).  NotFound where a
    reference names none; BadInput where a compaction item is not one made for the tenant."""
    if any(x["type"] == "compaction" for x in items):
        items = compaction.expanded(items, who, deployment_key(svc.settings))
    if not any(x["type"] == "item_reference" for x in items):
        return items
    out = []
    for x in items:
        if x["type"] != "item_reference":
            out.append(x)
            continue
        m = ids.ITEM_ID.fullmatch(x["id"])
        job = response(svc, m[1], who) if m is not None else None
        held = {} if job is None else {y["id"]: y for y in [*view.output_items(job),
                                                            *view.input_items(job)]}
        if x["id"] not in held:
            raise NotFound(f"item_reference names no item: {x['id'][:80]!r}")
        out.append(_as_input(held[x["id"]]))
    return out


def _as_input(item: dict[str, Any]) -> dict[str, Any]:
    """A stored item as a request's input item (CreateResponse.items()'s shape): an output
    message keeps its id (msg_: it names its response); an input item's own id (in_) goes."""
    if item["type"] == "function_call":
        return {k: item[k] for k in ("type", "call_id", "name", "arguments")}
    if item["type"] == "message":
        kind = "output_text" if item["role"] == "assistant" else "input_text"
        out = {"type": "message", "role": item["role"],
               "content": [{"type": kind, "text": "".join(p["text"] for p in item["content"])}]}
        return {**out, "id": item["id"]} if ids.MESSAGE_ID.fullmatch(item["id"]) else out
    return {k: v for k, v in item.items() if k not in ("id", "status")}


def _same_call(sent: dict[str, Any], made: dict[str, Any]) -> bool:
    """A re-sent call is the one made: the same name, its arguments the same JSON value (a client
    re-serialises them: `{"a":1}` is `{"a": 1}`)."""
    if sent["name"] != made["name"]:
        return False
    try:
        return bool(json.loads(sent["arguments"]) == json.loads(made["arguments"]))
    except ValueError:
        return bool(sent["arguments"] == made["arguments"])


def _after_held(prev: JobRecord, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input of a request that names `prev`, as OpenAI reads it: a client may re-send what
    `prev` already holds (its calls, its messages, the history before them) before what is new;
    the items up to the last that names one of prev's outputs are not new input, the rest are.
    BadInput where a re-sent call or message of prev is not what it made."""
    made = {y["call_id"]: y for y in view.output_items(prev) if y["type"] == "function_call"}
    wrote = {y["id"]: y["content"][0]["text"] for y in view.output_items(prev) if y["type"] == "message"}
    last = -1
    for i, x in enumerate(items):
        if x["type"] == "function_call" and x["call_id"] in made:
            if not _same_call(x, made[x["call_id"]]):
                raise BadInput(f"{x['call_id']} is not the call {ids.response_id(prev.id)} made: its name or "
                               "arguments differ")
            last = i
        elif x["type"] == "message" and x.get("id") in wrote:
            if mapping.message_text(x) != wrote[x["id"]]:
                raise BadInput(f"{x['id']} is not the message {ids.response_id(prev.id)} wrote: its text differs")
            last = i
    return items[last + 1:]


def _not_re_read(prev: JobRecord | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation's new input: `items` less each message its last response (`prev`) read,
    where that response waits for call outputs.  A client may send the step's question again
    with the outputs (the AI SDK does, leaving out the call the conversation holds); a response
    that goes on from a call reads only the outputs, and the question is the conversation's once."""
    if prev is None or not mapping.waiting_calls(prev):
        return items
    read = [(x["role"], mapping.message_text(x)) for x in view.input_items(prev) if x["type"] == "message"]
    return [x for x in items if x["type"] != "message" or (x["role"], mapping.message_text(x)) not in read]


def _went_on(svc: Services, who: str, prev: JobRecord, items: list[dict[str, Any]]) -> JobRecord:
    """The response a request that names `prev` goes on from: a client may keep naming the
    response its tool loop began from (the AI SDK sends the same previous_response_id on every
    step) and re-send the calls made since, each with its output.  Where the input's last
    output answers a call of a later response that went on from `prev` (its `previous` links
    reach prev within MAX_CHAIN), that response is where it goes on; else `prev`.  BadInput
    where that response does not descend from prev, or has not completed."""
    answered = [x["call_id"] for x in items if x["type"] == "function_call_output"]
    m = ids.CALL_ID.fullmatch(answered[-1]) if answered else None
    if m is None or m[1] == prev.id:
        return prev
    later = response(svc, m[1], who)
    up, steps = later.spec.get("previous"), 0
    while up is not None and up != prev.id and steps < MAX_CHAIN:  # each link a response this one went on from
        try:
            up, steps = response(svc, up, who).spec.get("previous"), steps + 1
        except NotFound:  # a link deleted: the chain is not known to reach prev
            up = None
    if up != prev.id:
        raise BadInput(f"{answered[-1]} is a call of {ids.response_id(later.id)}, which did not go on from "
                       f"previous response {ids.response_id(prev.id)}: name the response that made the call")
    if later.status != "succeeded":
        raise BadInput(f"{ids.response_id(later.id)}, whose call {answered[-1]} the input answers, is "
                       f"{view.status(later)}: only a completed one goes on")
    return later


def _submit(svc: Services, who: str, req: CreateResponse, spec: dict[str, Any], session: str | None) -> JobRecord:
    """The job on `session` (None: a new one)."""
    return svc.submit("response", who, spec, session, req.setflow.priority, open_session=session is None,
                      model=req.model if session is None and req.model in _hosted(svc) else None)


@contextmanager
def _going_on(svc: Services, session: str | None, conv: str | None) -> Iterator[bool]:
    """Whether this request alone goes on from `session` now (every API process: a Redis key,
    gone after GOING_ON_S should this one die).  Between _at's "nothing else runs on it" and the
    submit that makes it so, a second request from the same previous response would go on in
    the same session and read the first's turns: it forks instead (False); a second on a
    conversation is refused, as one is while its last response runs."""
    key = svc.keys.going_on(session) if session is not None else None
    if key is None or not svc.client.set(key, "1", nx=True, ex=GOING_ON_S):
        if key is not None and conv is not None:
            raise BadInput(f"conversation {conv} has a response being created: send the next once it has ended")
        yield key is None
        return
    try:
        yield True
    finally:
        svc.client.delete(key)


def _resent(svc: Services, who: str, items: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """A stateless client (the agents SDK's default) sends the whole history again: its last item
    that names one of our responses says where that history is held already, and it goes on from
    there, its K/V restored, as with previous_response_id.  That item is
    - the output of a call a response made (call_<job>_<n>), last: (that response, the outputs
      of its calls); the call as the history re-sends it must be the one it made;
    - a message a response wrote (msg_<job>_<i>), the items after it new (a question after an
      answer): (that response, those items); the message must be the one it wrote.
    BadInput where the history re-sent is not what the response made (an edited history is not
    what the session holds); (None, items) where no item names one."""
    for at in range(len(items) - 1, -1, -1):
        x = items[at]
        if x["type"] == "function_call_output" and (m := ids.CALL_ID.fullmatch(x["call_id"])):
            if at != len(items) - 1:
                break  # outputs, then more: no response ended where this history goes on
            prev = response(svc, m[1], who)
            made = {y["call_id"]: y for y in view.output_items(prev) if y["type"] == "function_call"}
            answered = [y for y in items if y["type"] == "function_call_output" and y["call_id"] in made]
            sent = [y for y in items if y["type"] == "function_call" and y["call_id"] in made]
            if x["call_id"] not in made or not all(_same_call(y, made[y["call_id"]]) for y in sent):
                raise BadInput(f"{x['call_id']} is not a call response {ids.response_id(prev.id)} made as the input "
                               "says: give its previous_response_id, or the history as it was")
            return ids.response_id(prev.id), answered
        if x["type"] == "message" and (m := ids.MESSAGE_ID.fullmatch(x.get("id") or "")):
            prev = response(svc, m[1], who)
            wrote = {y["id"]: y for y in view.output_items(prev) if y["type"] == "message"}
            if x["id"] not in wrote or wrote[x["id"]]["content"][0]["text"] != "".join(p["text"] for p in x["content"]):
                raise BadInput(f"{x['id']} is not a message response {ids.response_id(prev.id)} wrote as the input "
                               "says: give its previous_response_id, or the history as it was")
            rest = [{k: v for k, v in y.items() if k != "id"} for y in items[at + 1:]]
            return (ids.response_id(prev.id), rest) if rest else (None, items)
    return None, items


def _hosted(svc: Services) -> set[str]:
    """The models live workers host (a request naming another runs on the default: OpenAI's
    clients name a model whatever the server)."""
    return {h.model for h in Hosts(svc.client, svc.settings).live()}


def _at(svc: Services, prev: JobRecord, who: str, fork: bool) -> tuple[str, bool]:
    """The session to go on from `prev` in, and whether it is a fork: its own while `prev` is its
    latest turn and nothing else runs on it (O(1): the next turn restores its K/V), else a fork
    at prev's last turn (copy on write: the fork shares the K/V segments in Redis)."""
    assert prev.session_id is not None
    turns = [t["turn"] for t in (prev.result or {}).get("turns", []) if t.get("turn", -1) >= 0]
    if not turns:
        raise BadInput(f"response {ids.response_id(prev.id)} wrote nothing to go on from")
    last = max(turns)
    latest = svc.records.turn_count(prev.session_id, who) - 1
    if not fork and last == latest and not svc.jobs.unfinished_jobs(prev.session_id):
        return prev.session_id, False
    svc.limiter.take(who)
    return lifecycle.fork_session(svc.store, svc.records, prev.session_id, who, last).id, True


def response(svc: Services, job_id: str, who: str) -> JobRecord:
    """The tenant's response `job_id`; NotFound for another tenant's, or a job of another kind."""
    job = svc.jobs.get(job_id, who)  # NotFound for another tenant's
    if job.kind != "response":
        raise NotFound(f"no response {ids.response_id(job_id)}")
    return job
