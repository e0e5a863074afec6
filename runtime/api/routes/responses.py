"""/v1/responses: OpenAI's Responses API over setflow's sessions (the request and its mapping:
runtime/api/responses.py; the response object: response_view.py; the stream: response_stream.py).
A response is a `response` job; a conversation, or a chain of previous_response_id, is a session
whose K/V lives in Redis, so the next response restores it on any worker instead of reading the
history again.  A response that ends at a function call holds no worker: the next one carries the
output.

    POST   /v1/responses                      create (wait for it; `stream`: its events; `background`)
    GET    /v1/responses/{id}                 the response (`stream=true&starting_after=N`: its events again)
    POST   /v1/responses/{id}/cancel          cancel
    DELETE /v1/responses/{id}                 delete
    GET    /v1/responses/{id}/input_items     its input items
    POST   /v1/responses/compact              compact a history: one opaque `compaction` item (compaction.py)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, contextmanager
from typing import Annotated, Any

import redis
from anyio.to_thread import run_sync
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from runtime.api import compaction, gate, response_stream, response_view
from runtime.api import responses as shapes
from runtime.api.deps import Svc, Tenant
from runtime.api.idempotency import STREAMED
from runtime.api.models import ERRORS
from runtime.api.responses import BuiltinTool, CompactRequest, CreateResponse
from runtime.api.services import Services
from runtime.errors import BadInput, Busy, NotFound, RateLimited
from runtime.jobs.conversations import Conversations
from runtime.jobs.events import entries
from runtime.jobs.hosts import Hosts
from runtime.jobs.webhook_secrets import deployment_key
from runtime.sessions import lifecycle
from runtime.tables import TERMINAL, JobRecord

router = APIRouter(prefix="/v1/responses", tags=["responses"])
log = logging.getLogger("setflow.api")
ResponseId = Annotated[str, Path(max_length=256)]  # any form: one that names no response is a 404 (shapes.job_of)
KEEPALIVE_S = 15.0
GOING_ON_S = 30  # a request's hold on the session it goes on from (_going_on): past any submit
FORGET_WAIT_S = 120.0  # a left store-false response, cancelled, is waited for this long, then retention's
FORGET_POLL_S = 2.0  # and its row read this often
MAX_FORGETTING = 256  # such waits in the process at once
MAX_CHAIN = 64  # responses _went_on walks back from a call's response to the one a request names


@router.post("/compact", responses=ERRORS)
def compact_response(req: CompactRequest, who: Tenant, svc: Svc) -> JSONResponse:
    """The history (the previous response's chain, then the input) compacted into one opaque
    `compaction` item, which the client sends as the input of its next request, with its new
    question after it (runtime/api/compaction.py says what is kept).  No model runs: its usage is
    zero.  BadInput where the history holds no message."""
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        prev = _response(svc, shapes.job_of(req.previous_response_id), who)
        if prev.status != "succeeded":
            raise BadInput(f"previous response {req.previous_response_id} is {response_view.status(prev)}: "
                           "only a completed one is compacted")
        history = _chain(svc, who, prev)
    history += referenced(svc, who, req.items())
    kept = compaction.kept(history)
    if not kept:
        raise BadInput("the history holds no message to keep: compact a history of messages (input, or "
                       "previous_response_id)")
    item = compaction.item(kept, who, deployment_key(svc.settings))
    return JSONResponse({"id": item["id"], "object": "response.compaction", "output": [item],
                         "created_at": int(time.time()),
                         "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                                   "input_tokens_details": {"cached_tokens": 0},
                                   "output_tokens_details": {"reasoning_tokens": 0}}})


def _compacted(svc: Services, who: str, req: CreateResponse, prev: JobRecord,
               items: list[dict[str, Any]]) -> list[dict[str, str]] | None:
    """Server-side compaction (context_management's compact_threshold): where the session `prev`
    left holds more positions than the threshold (what its last response read and wrote), the
    messages kept of its chain and this input (compaction.kept); the response runs on a session
    of its own over them, and its output begins with the compaction item.  None: it goes on in
    the session as it is (no threshold, not past it, or a call of prev waits for its output:
    its state is the session's)."""
    limit = req.compact_threshold()
    if limit is None or shapes.waiting_calls(prev):
        return None
    usage = (prev.result or {}).get("usage") or {}
    if int(usage.get("input", 0)) + int(usage.get("output", 0)) <= limit:
        return None
    return compaction.kept([*_chain(svc, who, prev), *items]) or None


def _chain(svc: Services, who: str, job: JobRecord) -> list[dict[str, Any]]:
    """The items of the chain that ends at `job`: each response's input and output items, the
    first response's first (back MAX_CHAIN responses at most; a deleted one ends it)."""
    chain = [job]
    while len(chain) < MAX_CHAIN and (before := chain[-1].spec.get("previous")) is not None:
        try:
            chain.append(_response(svc, before, who))
        except NotFound:
            break
    return [x for j in reversed(chain) for x in [*response_view.input_items(j), *response_view.output_items(j)]]


@router.post("", responses=ERRORS)
async def create_response(req: CreateResponse, request: Request, who: Tenant, svc: Svc) -> Response:
    """Create a response: it runs as a job on its conversation's session (a new one without a
    conversation or a previous response).  Without `background` or `stream` the call waits for it
    (up to response_wait_s, holding no thread: _ended; then it answers with the response as it
    is, in progress)."""
    if not req.background and (full := svc.streams_full(who)) is not None:  # a stream or a wait: refused before its job
        raise RateLimited(full, retry_after_s=KEEPALIVE_S)
    job = await run_sync(submit, svc, who, req)
    limits = await run_sync(_limits, svc, who)
    if req.stream:
        try:
            out = _streaming(svc, who, job, -1, drop=not req.store, created=True)
        except RateLimited:  # another request took the last place meanwhile: its 429 leaves nothing running
            await run_sync(svc.dispatcher.cancel, job.id, who)
            if not req.store:
                _abandon(svc, job)
            raise
        out.headers.update(limits)
        return out
    if not req.background:
        gate.release_turn(request.scope)  # the wait holds no thread: nor the tenant's turn (gate.Turns)
        with svc.stream_slot(who):  # a wait holds what a stream holds (a Redis read): counted as one
            job = await _ended(svc, job, svc.settings.response_wait_s, gone=request.is_disconnected)
        if not req.store and await request.is_disconnected():  # its client left: nobody can read it now
            _abandon(svc, job)
            # "retry later" for an Idempotency-Key: its key is freed, a retry runs anew
            return Response(status_code=499, headers={"Retry-After": "1"})
        # (a stored one's client that left gets the response as it is, as at the timeout: what an
        # Idempotency-Key keeps for its retry, which reads it by its id)
    body = response_view.view(job)
    if not req.store and job.status in TERMINAL:
        await run_sync(forget, svc, job)
    return JSONResponse(body, headers=limits)


async def _ended(svc: Services, job: JobRecord, timeout_s: float,
                 gone: Callable[[], Awaitable[bool]] | None = None) -> JobRecord:
    """The job once it has ended, or as it is at the timeout or when `gone` says its client
    left: woken by its status events (an async read: no thread held while it waits); its row
    read at a status event and every second (events are best effort; SQL is the truth)."""
    r, key, at = svc.aclient(), svc.keys.events(job.id), "0"
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            job, checked = await run_sync(svc.jobs.get, job.id), time.monotonic()
            if job.status in TERMINAL or checked >= deadline or (gone is not None and await gone()):
                return job
            said = False  # a status event: the row may have moved
            while not said and time.monotonic() - checked < 1.0:
                try:
                    for eid, ev in entries(await r.xread({key: at}, count=1000, block=1000)):
                        at, said = eid, said or ev.get("type") == "status"
                except redis.RedisError:
                    await asyncio.sleep(0.5)
    finally:
        await r.aclose()


def _limits(svc: Services, who: str) -> dict[str, str]:
    """The tenant's rate limit as OpenAI's headers (none where Redis cannot say: the response stands)."""
    try:
        return svc.limiter.headers(who)
    except redis.RedisError:
        return {}


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
        session = shapes.session_of(conv)
        convs = Conversations(svc.sql, svc.settings)
        with _going_on(svc, session, conv):
            pending = convs.get(session, who).pending  # NotFound for another tenant's
            done = convs.responses(session)
            prev = done[-1] if done else None
            items = [*pending, *_not_re_read(prev, given)]  # the added items keep their ids: listed the same after
            if prev is not None and prev.status not in TERMINAL:
                raise BadInput(f"the conversation's last response ({shapes.response_id(prev.id)}) has not ended")
            job = _submit(svc, who, req, _spec(req, items, prev if prev is not None and prev.status == "succeeded"
                                               else None, conv), session)
            if pending:
                convs.take(session, who, pending)
            return job
    items, prev = given, None
    if prev_id is None:  # a client that re-sends the history: its last call's response goes on
        prev_id, items = _resent(svc, who, items)
    if prev_id is not None:
        prev = _response(svc, shapes.job_of(prev_id), who)
        if prev.status != "succeeded":
            raise BadInput(f"previous response {prev_id} is {response_view.status(prev)}: only a completed one goes on")
        prev = _went_on(svc, who, prev, items)
        items = _after_held(prev, items)
    compacted = _compacted(svc, who, req, prev, items) if prev is not None else None
    if compacted is not None:  # a session of its own, over the kept messages and this input
        items, prev = compaction.as_items(compacted), None
    spec = _spec(req, items, prev, None)  # every check of the request before a fork: a refusal forks nothing
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


def _spec(req: CreateResponse, items: list[dict[str, Any]], prev: JobRecord | None, conv: str | None) -> dict[str, Any]:
    """The job's spec (BadInput where the request does not fit), going on from `prev`."""
    spec = shapes.plan(req, items, prev)
    if prev is not None:
        spec["previous"] = prev.id
    spec["request"] = {**req.model_dump(mode="json", exclude={"input", "setflow", "stream"}, exclude_none=True),
                       "items": items, "conversation": conv, "store": req.store, "background": req.background,
                       **({"step_events": True} if req.setflow.step_events else {})}
    return spec


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
        m = shapes.ITEM_ID.fullmatch(x["id"])
        job = _response(svc, m[1], who) if m is not None else None
        held = {} if job is None else {y["id"]: y for y in [*response_view.output_items(job),
                                                            *response_view.input_items(job)]}
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
        return {**out, "id": item["id"]} if shapes.MESSAGE_ID.fullmatch(item["id"]) else out
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
    made = {y["call_id"]: y for y in response_view.output_items(prev) if y["type"] == "function_call"}
    wrote = {y["id"]: y["content"][0]["text"] for y in response_view.output_items(prev) if y["type"] == "message"}
    last = -1
    for i, x in enumerate(items):
        if x["type"] == "function_call" and x["call_id"] in made:
            if not _same_call(x, made[x["call_id"]]):
                raise BadInput(f"{x['call_id']} is not the call {shapes.response_id(prev.id)} made: its name or "
                               "arguments differ")
            last = i
        elif x["type"] == "message" and x.get("id") in wrote:
            if shapes.message_text(x) != wrote[x["id"]]:
                raise BadInput(f"{x['id']} is not the message {shapes.response_id(prev.id)} wrote: its text differs")
            last = i
    return items[last + 1:]


def _not_re_read(prev: JobRecord | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation's new input: `items` less each message its last response (`prev`) read,
    where that response waits for call outputs.  A client may send the step's question again
    with the outputs (the AI SDK does, leaving out the call the conversation holds); a response
    that goes on from a call reads only the outputs, and the question is the conversation's once."""
    if prev is None or not shapes.waiting_calls(prev):
        return items
    read = [(x["role"], shapes.message_text(x)) for x in response_view.input_items(prev) if x["type"] == "message"]
    return [x for x in items if x["type"] != "message" or (x["role"], shapes.message_text(x)) not in read]


def _went_on(svc: Services, who: str, prev: JobRecord, items: list[dict[str, Any]]) -> JobRecord:
    """The response a request that names `prev` goes on from: a client may keep naming the
    response its tool loop began from (the AI SDK sends the same previous_response_id on every
    step) and re-send the calls made since, each with its output.  Where the input's last
    output answers a call of a later response that went on from `prev` (its `previous` links
    reach prev within MAX_CHAIN), that response is where it goes on; else `prev`.  BadInput
    where that response does not descend from prev, or has not completed."""
    answered = [x["call_id"] for x in items if x["type"] == "function_call_output"]
    m = shapes.CALL_ID.fullmatch(answered[-1]) if answered else None
    if m is None or m[1] == prev.id:
        return prev
    later = _response(svc, m[1], who)
    up, steps = later.spec.get("previous"), 0
    while up is not None and up != prev.id and steps < MAX_CHAIN:  # each link a response this one went on from
        try:
            up, steps = _response(svc, up, who).spec.get("previous"), steps + 1
        except NotFound:  # a link deleted: the chain is not known to reach prev
            up = None
    if up != prev.id:
        raise BadInput(f"{answered[-1]} is a call of {shapes.response_id(later.id)}, which did not go on from "
                       f"previous response {shapes.response_id(prev.id)}: name the response that made the call")
    if later.status != "succeeded":
        raise BadInput(f"{shapes.response_id(later.id)}, whose call {answered[-1]} the input answers, is "
                       f"{response_view.status(later)}: only a completed one goes on")
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
        if x["type"] == "function_call_output" and (m := shapes.CALL_ID.fullmatch(x["call_id"])):
            if at != len(items) - 1:
                break  # outputs, then more: no response ended where this history goes on
            prev = _response(svc, m[1], who)
            made = {y["call_id"]: y for y in response_view.output_items(prev) if y["type"] == "function_call"}
            answered = [y for y in items if y["type"] == "function_call_output" and y["call_id"] in made]
            sent = [y for y in items if y["type"] == "function_call" and y["call_id"] in made]
            if x["call_id"] not in made or not all(_same_call(y, made[y["call_id"]]) for y in sent):
                raise BadInput(f"{x['call_id']} is not a call response {shapes.response_id(prev.id)} made as the input "
                               "says: give its previous_response_id, or the history as it was")
            return shapes.response_id(prev.id), answered
        if x["type"] == "message" and (m := shapes.MESSAGE_ID.fullmatch(x.get("id") or "")):
            prev = _response(svc, m[1], who)
            wrote = {y["id"]: y for y in response_view.output_items(prev) if y["type"] == "message"}
            if x["id"] not in wrote or wrote[x["id"]]["content"][0]["text"] != "".join(p["text"] for p in x["content"]):
                raise BadInput(f"{x['id']} is not a message response {shapes.response_id(prev.id)} wrote as the input "
                               "says: give its previous_response_id, or the history as it was")
            rest = [{k: v for k, v in y.items() if k != "id"} for y in items[at + 1:]]
            return (shapes.response_id(prev.id), rest) if rest else (None, items)
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
        raise BadInput(f"response {shapes.response_id(prev.id)} wrote nothing to go on from")
    last = max(turns)
    latest = svc.records.turn_count(prev.session_id, who) - 1
    if not fork and last == latest and not svc.jobs.unfinished_jobs(prev.session_id):
        return prev.session_id, False
    svc.limiter.take(who)
    return lifecycle.fork_session(svc.store, svc.records, prev.session_id, who, last).id, True


def _response(svc: Services, job_id: str, who: str) -> JobRecord:
    job = svc.jobs.get(job_id, who)  # NotFound for another tenant's
    if job.kind != "response":
        raise NotFound(f"no response {shapes.response_id(job_id)}")
    return job


def forget(svc: Services, job: JobRecord) -> None:
    """A response with store false keeps nothing past itself: its session (turns, K/V, the job)
    is deleted; it ran on a session of its own (a new one, or a fork)."""
    if job.session_id is None:
        return
    try:
        lifecycle.delete_session(svc.store, svc.records, job.session_id, job.tenant)
        svc.dispatcher.events.drop(job.tenant, [job.id])  # its stream, and out of its tenant's account now
    except Exception:  # noqa: BLE001 - the reaper's retention deletes it later
        log.warning("response %s (store false): its session was not deleted", job.id, exc_info=True)


@router.get("/{response_id}", responses=ERRORS)
async def get_response(response_id: ResponseId, who: Tenant, svc: Svc, stream: bool = False,
                       starting_after: Annotated[int | None, Query(ge=-1, lt=2**31)] = None) -> Response:
    """The response; `stream=true`: its events from the start, or after `starting_after` (the
    sequence_number of the last event a client has), at any time the job's event stream is kept
    (events_ttl_s after its last event: a response's stream is never compacted, so a replay
    numbers its events as the first read did).  A stream opened takes a rate-limit token."""
    job = await run_sync(_response, svc, shapes.job_of(response_id), who)
    if stream:
        if (full := svc.streams_full(who)) is not None:
            raise RateLimited(full, retry_after_s=KEEPALIVE_S)
        await run_sync(svc.limiter.take, who)
        return _streaming(svc, who, job, -1 if starting_after is None else starting_after, drop=False)
    return JSONResponse(response_view.view(job))


@router.post("/{response_id}/cancel", responses=ERRORS)
def cancel_response(response_id: ResponseId, who: Tenant, svc: Svc) -> JSONResponse:
    """Cancel: a queued response ends at once, one in progress at its next decode step; one that
    has ended is returned as it is.  A cancel takes a rate-limit token (after the 404)."""
    job = _response(svc, shapes.job_of(response_id), who)
    svc.limiter.take(who)
    return JSONResponse(response_view.view(svc.dispatcher.cancel(job.id, who)))


@router.delete("/{response_id}", responses=ERRORS)
def delete_response(response_id: ResponseId, who: Tenant, svc: Svc) -> JSONResponse:
    """Delete a response that has ended (409 busy before: cancel it first).  A response on a
    session of its own takes the session with it (turns, K/V); one of a conversation, or one
    another response went on from, leaves the session's turns to them."""
    job = _response(svc, shapes.job_of(response_id), who)
    if job.status not in TERMINAL:
        raise Busy(f"response {response_id} has not ended: cancel it first")
    assert job.session_id is not None
    convs = Conversations(svc.sql, svc.settings)
    others = svc.jobs.unfinished_jobs(job.session_id) or [j for j in convs.responses(job.session_id) if j.id != job.id]
    if others or convs.is_conversation(job.session_id):
        svc.jobs.delete(job.id, who)
    else:
        forget(svc, job)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


@router.get("/{response_id}/input_items", responses=ERRORS)
def input_items(response_id: ResponseId, who: Tenant, svc: Svc,
                limit: Annotated[int, Query(ge=1, le=100)] = 20, order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
                after: Annotated[str | None, Query(max_length=128)] = None) -> JSONResponse:
    job = _response(svc, shapes.job_of(response_id), who)
    return JSONResponse(page(response_view.input_items(job), limit, order, after))


def page(items: list[dict[str, Any]], limit: int, order: str, after: str | None) -> dict[str, Any]:
    """OpenAI's list: `data` in `order`, after the item `after`, at most `limit`."""
    items = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [x["id"] for x in items]
        if after not in ids:
            raise BadInput(f"no item {after!r} in this list")
        items = items[ids.index(after) + 1:]
    data = items[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(items) > limit}


# ---- the stream --------------------------------------------------------------------------------

def _streaming(svc: Services, who: str, job: JobRecord, after: int, drop: bool, created: bool = False) -> Response:
    if (full := svc.streams_full(who)) is not None:
        raise RateLimited(full, retry_after_s=KEEPALIVE_S)
    return StreamingResponse(_events(svc, who, job, after, drop, created), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                      STREAMED: shapes.response_id(job.id)})  # what an Idempotency-Key keeps of it


def _sse(ev: dict[str, Any]) -> str:
    return f"id: {ev['sequence_number']}\nevent: {ev['type']}\ndata: {json.dumps(ev, separators=(',', ':'))}\n\n"


async def _events(svc: Services, who: str, job: JobRecord, after: int, drop: bool,
                  created: bool) -> AsyncIterator[str]:
    """The response's events (events) as server-sent events, in one of the tenant's stream slots."""
    # checked and counted in one step (no await between them): of streams that passed the route's
    # check together, the one over the cap says so (OpenAI's error event), and the response it
    # created is cancelled, as a 429 before it would have left nothing running
    if (full := svc.streams_full(who)) is not None:
        yield _sse({"type": "error", "code": "rate_limited", "message": full, "param": None, "sequence_number": 0})
        if created:
            await run_sync(svc.dispatcher.cancel, job.id, who)
            if drop:
                _abandon(svc, job)
        return
    with svc.stream_slot(who):  # counted while it runs (a stream never started holds nothing)
        async with aclosing(events(svc, job, after, drop)) as evs:
            async for ev in evs:
                yield ": keep-alive\n\n" if ev is None else _sse(ev)


async def events(svc: Services, job: JobRecord, after: int,
                 drop: bool) -> AsyncGenerator[dict[str, Any] | None, None]:
    """The response's events with sequence_number > after: translated from the job's event
    stream from its start (response_stream.Translator: the same events and numbers on every read), the
    last ones from its row once it has ended (SQL is the truth: read every second too, so the
    stream ends with the job even if its final event was lost).  None: KEEPALIVE_S went by
    without one.  `drop` (store false): forgotten at its end, abandoned where the reader leaves
    first.  The SSE stream (_events) and a WebSocket (routes/response_socket.py) read it alike."""
    r = svc.aclient()
    key, at = svc.keys.events(job.id), "0"
    tr = response_stream.Translator(job, await run_sync(svc.tokenizer, ""),
                                    steps=bool(job.spec.get("request", {}).get("step_events")))
    quiet = checked = time.monotonic()
    try:
        for ev in tr.start():
            if ev["sequence_number"] > after:
                yield ev
        while True:
            ended = False
            try:
                for eid, raw in entries(await r.xread({key: at}, count=1000, block=1000)):
                    at, quiet = eid, time.monotonic()
                    for ev in tr.feed(raw):
                        if ev["sequence_number"] > after:
                            yield ev
                    ended = ended or (raw.get("type") == "status" and raw.get("status") in TERMINAL)
            except redis.RedisError:
                await asyncio.sleep(0.5)
                continue
            now = time.monotonic()
            if ended or now - checked >= 1.0:
                checked = now
                final = await run_sync(svc.jobs.get, job.id)
                if final.status in TERMINAL:
                    # what the stream holds that this read has not reached yet comes first
                    for eid, raw in entries(await r.xread({key: at}, count=100_000)):
                        at = eid
                        for ev in tr.feed(raw):
                            if ev["sequence_number"] > after:
                                yield ev
                    for ev in tr.finish(final):
                        if ev["sequence_number"] > after:
                            yield ev
                    if drop:
                        drop = False
                        await run_sync(forget, svc, final)
                    return
            if now - quiet >= KEEPALIVE_S:
                quiet = now
                yield None
    finally:
        if drop:  # the client left before the end (or this read failed): nobody can read it now
            _abandon(svc, job)
        await r.aclose()


_LATER: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references to its tasks


def _abandon(svc: Services, job: JobRecord) -> None:
    """A store-false response whose client left before its end: nobody can read it any more, so
    it is cancelled, and deleted once it has ended (a cancelled job stops at its next step).  The
    wait for that end reads SQL every FORGET_POLL_S for at most FORGET_WAIT_S, at most
    MAX_FORGETTING of them in the process; past either, session_retention_s deletes it."""
    async def later() -> None:
        try:
            final = await run_sync(svc.dispatcher.cancel, job.id, job.tenant)
            deadline = time.monotonic() + FORGET_WAIT_S
            while final.status not in TERMINAL and time.monotonic() < deadline:
                await asyncio.sleep(FORGET_POLL_S)
                final = await run_sync(svc.jobs.get, job.id)
            if final.status in TERMINAL:
                await run_sync(forget, svc, final)
        except Exception:  # noqa: BLE001 - the retention deletes it later
            log.warning("response %s (store false, left): not forgotten now", job.id, exc_info=True)

    if len(_LATER) >= MAX_FORGETTING:
        return
    task = asyncio.get_running_loop().create_task(later())
    _LATER.add(task)
    task.add_done_callback(_LATER.discard)
