"""WebSocket mode on /v1/responses, as OpenAI's: one socket, `response.create` frames that carry
the body of POST /v1/responses (stream is implied; background is refused), each answered with
the events its SSE stream sends, one JSON text frame each.  A frame runs chain.py's
`submit` and reads stream.py's `events`: there is no second Responses path here.  A stored
response's session lives in Redis and its row in SQL, as over HTTP, so a client that reconnects
goes on from previous_response_id on any socket and any worker.  A store-false response is the
socket's own, as the Open Responses spec's WebSocket mode has it (Kept): the socket keeps the
latest one it made until a later response on it ends, a continuation from it is refused or the
socket closes; named anywhere else, or after, it is `previous_response_not_found`, as is an id
that names no response.

What a socket may hold, each bounded:
- a frame: at most max_body_bytes (an `error` event), and uvicorn reads none past
  max_body_bytes + FRAME_MARGIN (it closes with 1009: frame_ceiling);
- one response at a time: at most WS_MAX_QUEUE frames sent while one streams wait, in order
  (Inbox; the socket is read meanwhile, so a client gone is seen at once); one more is refused
  (an `error` event, rate_limited);
- one of its tenant's event streams (max_streams_per_tenant, max_streams) for its whole life:
  a socket past them is refused at the upgrade (429), as a stream is;
- IDLE_S without a frame, MAX_AGE_S in all: then it is closed (1000, the reason says which;
  at MAX_AGE_S an `error` event, websocket_connection_limit_reached, comes first, as the spec's);
- one store-false response of its own (Kept), forgotten at the latest when the socket closes.
A bad key is refused at the upgrade: 401, OpenAI's error as its body, nothing read or kept."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import ExitStack, aclosing
from typing import Any

import redis
from anyio.to_thread import run_sync
from fastapi import APIRouter, WebSocket
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError
from starlette.types import Message
from starlette.websockets import WebSocketDisconnect, WebSocketDisconnected

from runtime.api import errors, gate
from runtime.api.auth import Unauthorized, tenant_of
from runtime.api.openai import ids
from runtime.api.openai.chain import response, submit
from runtime.api.openai.forget import abandon
from runtime.api.openai.request import CreateResponse
from runtime.api.openai.stream import events
from runtime.api.services import Services
from runtime.errors import NotFound, RateLimited, SetflowError
from runtime.settings import Settings
from runtime.tables import JobRecord

router = APIRouter(prefix="/v1/responses", tags=["responses"])
log = logging.getLogger("setflow.api")
PATH = "/v1/responses"
IDLE_S = 600.0  # a socket with no frame this long is closed (a client's tool may take minutes)
MAX_AGE_S = 3600.0  # and any socket after an hour (OpenAI's limit): the client reconnects and goes on
FRAME_MARGIN = 4096  # uvicorn's frame ceiling over max_body_bytes: a frame a little past it gets an error event
WS_MAX_QUEUE = 4  # frames that wait while a response streams (Inbox), and uvicorn's own queue of frames per socket
LANE_MAX = 64  # a stream_id's length, echoed on its response's events


def frame_ceiling(settings: Settings) -> int:
    """uvicorn's ws_max_size: the largest frame it reads (app/serve.py; ws_max_queue=WS_MAX_QUEUE)."""
    return settings.max_body_bytes + FRAME_MARGIN


class FrameError(Exception):
    """A frame refused: an `error` event, and the socket goes on."""

    def __init__(self, code: str, message: str, status: int, param: str | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.status, self.param, self.retry_after_s = code, message, status, param, retry_after_s


@router.websocket("")
async def responses_socket(ws: WebSocket) -> None:
    """The socket: its tenant from the upgrade's API key (401 else), one of its stream slots
    (429 else), then its frames in order until the client closes, IDLE_S or MAX_AGE_S."""
    svc: Services = ws.app.state.services
    try:
        who = tenant_of(svc.keyring, ws.headers)
    except Unauthorized as e:
        await _refuse(ws, "unauthorized", str(e), 401)
        return
    with ExitStack() as held:
        try:
            held.enter_context(svc.stream_slot(who))
        except RateLimited as e:
            await _refuse(ws, "rate_limited", str(e), 429)
            return
        await ws.accept()
        try:
            await _serve(ws, svc, who)
        except (WebSocketDisconnect, WebSocketDisconnected):
            pass  # the client left: a response it was reading goes on (store false: abandoned, as over SSE)


async def _refuse(ws: WebSocket, code: str, message: str, status: int) -> None:
    """The upgrade refused with the HTTP error a request would get (where the server can send
    one; else closed with 1008 and the message as its reason)."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(errors.body(code, message, status, PATH))
    else:
        await ws.close(code=1008, reason=message[:120])


class Kept:
    """The socket's connection-local state (the spec's WebSocket continuation): the latest
    store-false response made on this socket, which a later frame may go on from with
    previous_response_id.  Kept until a later response on the socket ends (it then holds that one,
    if store false), a continuation that names it is refused (4xx or 5xx: evicted), or the socket
    closes; then forgotten (forget.abandon: its session deleted).  A stored response that went on
    from it holds it in its chain (its session, its history): it is then only let go.  Its
    changes are made with no await between the end of a response and them, so a client that
    closes the socket right after a response's last event leaves nothing behind."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.job: JobRecord | None = None

    def holds(self, rid: str | None) -> bool:
        return self.job is not None and rid == ids.response_id(self.job.id)

    def evict(self, rid: Any) -> None:
        """A turn that named `rid` as its previous response failed: it goes (if it is the kept one)."""
        if isinstance(rid, str) and self.holds(rid):
            self.close()

    def ended(self, job: JobRecord, store: bool) -> None:
        """`job`, which has ended, is now the socket's latest response: the one kept before goes
        (abandon reads its row again: a new response's session is made by its worker)."""
        old, self.job = self.job, (None if store else job)
        if old is None or old.id == job.id or (store and job.spec.get("previous") == old.id):
            return
        abandon(self.svc, old)

    def close(self) -> None:
        if self.job is not None:
            abandon(self.svc, self.job)
            self.job = None


def _persisted(svc: Services, who: str, rid: str) -> None:
    """A previous_response_id the socket does not keep: a stored response of the tenant's goes
    on (from SQL and Redis, on any socket); else previous_response_not_found (an unknown id, or a
    store-false response: it lives only on the socket that made it, while that socket keeps it)."""
    try:
        prev = response(svc, ids.job_of(rid), who)
    except NotFound:
        raise _not_found(rid, "no response has this id") from None
    if not prev.spec.get("request", {}).get("store", True):
        raise _not_found(rid, "a store-false response goes on only on the socket that made it, while it is that "
                         "socket's latest response: start a new response with the whole input, or use store true")


def _not_found(rid: str, why: str) -> FrameError:
    return FrameError("previous_response_not_found", f"Previous response with id {rid[:80]!r} not found: {why}",
                      400, param="previous_response_id")


class Inbox:
    """The socket's frames, read as they come, so that a client gone is seen while a response
    streams: at most WS_MAX_QUEUE wait their turn, and one past them is refused (counted: an
    error event each once the response in flight has ended)."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.frames: asyncio.Queue[Message | None] = asyncio.Queue()  # None: the client left
        self.refused = 0

    async def read(self) -> None:
        try:
            while (msg := await self.ws.receive())["type"] != "websocket.disconnect":
                if self.frames.qsize() >= WS_MAX_QUEUE:
                    self.refused += 1
                else:
                    self.frames.put_nowait(msg)
        finally:
            self.frames.put_nowait(None)


async def _serve(ws: WebSocket, svc: Services, who: str) -> None:
    """The frames in order, one response at a time, until the client leaves, IDLE_S or MAX_AGE_S."""
    opened, inbox, kept = time.monotonic(), Inbox(ws), Kept(svc)
    reader = asyncio.get_running_loop().create_task(inbox.read())
    try:
        while True:
            if inbox.refused:
                inbox.refused -= 1
                await _send(ws, _error(FrameError("rate_limited", f"one response at a time: {WS_MAX_QUEUE} events "
                                                  "waited already, and one more was not read", 429)), {})
                continue
            left = MAX_AGE_S - (time.monotonic() - opened)
            try:
                if left <= 0:
                    raise TimeoutError
                msg = await asyncio.wait_for(inbox.frames.get(), min(IDLE_S, left))
            except TimeoutError:
                why = "open for an hour" if left <= IDLE_S else f"no frame for {IDLE_S:.0f} s"
                if left <= IDLE_S:  # the spec's limit: its error event, then the close
                    await _send(ws, _error(FrameError("websocket_connection_limit_reached", "a socket is open for "
                                                      f"{MAX_AGE_S / 60:.0f} minutes at most: open a new one and go "
                                                      "on with previous_response_id", 400)), {})
                await ws.close(code=1000, reason=f"{why}: reconnect and go on with previous_response_id")
                return
            if msg is None:
                return
            turn = asyncio.get_running_loop().create_task(_turn(ws, svc, who, msg, kept))
            await asyncio.wait({turn, reader}, return_when=asyncio.FIRST_COMPLETED)
            if not turn.done():  # the client left while its response streamed: its reading ends (_create)
                turn.cancel()
                await asyncio.gather(turn, return_exceptions=True)
                return
            turn.result()
    finally:
        kept.close()  # the socket's own store-false response: nobody can go on from it now
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def _turn(ws: WebSocket, svc: Services, who: str, msg: Message, kept: Kept) -> None:
    """One frame: its response's events, or its error event (and the previous response it names
    leaves the socket's Kept, as the spec has a failed continuation evict it)."""
    lane: dict[str, str] = {}
    frame: dict[str, Any] = {}
    try:
        frame = _frame(msg, svc.settings.max_body_bytes)
        if isinstance(frame.get("stream_id"), str) and len(frame["stream_id"]) <= LANE_MAX:
            lane = {"stream_id": frame["stream_id"]}
        if frame.get("type") != "response.create":
            raise FrameError("bad_input", f"a client event here is response.create; "
                             f"{str(frame.get('type'))[:40]!r} is not one", 400, param="type")
        await _create(ws, svc, who, frame, lane, kept)
    except FrameError as e:
        kept.evict(frame.get("previous_response_id"))
        await _send(ws, _error(e), lane)
    except (WebSocketDisconnect, WebSocketDisconnected, asyncio.CancelledError):
        raise
    except Exception as e:  # noqa: BLE001 - one line, never the tenant's input; the socket goes on
        log.error("internal error on a %s socket: %s", PATH, type(e).__name__)
        kept.evict(frame.get("previous_response_id"))
        await _send(ws, _error(FrameError("internal", "the server failed on this event; it was logged", 500)), lane)


def _frame(msg: Message, limit: int) -> dict[str, Any]:
    """A text frame's JSON object (FrameError for anything else)."""
    text = msg.get("text")
    if text is None:
        raise FrameError("bad_input", "send each event as a JSON text frame (a binary frame is not read)", 400)
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) > limit:
        raise FrameError("too_large", f"a frame is at most {limit} bytes; this one is {len(raw)}", 413)
    if (at := gate.lone_surrogate(raw)) is not None:
        raise FrameError("bad_input", f"a JSON string holds a lone surrogate (byte {at}): text is Unicode characters", 400)
    try:
        frame = json.loads(text)
    except ValueError as e:
        raise FrameError("bad_input", f"a frame is one JSON object: {e}", 400) from None
    if not isinstance(frame, dict):
        raise FrameError("bad_input", "a frame is one JSON object, its `type` response.create", 400, param="type")
    return frame


def _request(frame: dict[str, Any]) -> CreateResponse:
    """The frame's body as POST /v1/responses reads it, streamed."""
    body = {k: v for k, v in frame.items() if k not in ("type", "stream_id", "stream")}
    if body.pop("background", None):
        raise FrameError("bad_input", "background is not supported over a WebSocket: POST /v1/responses with "
                         "background true, or leave it out here", 400, param="background")
    try:
        return CreateResponse.model_validate({**body, "stream": True})
    except ValidationError as e:
        message, param = errors.openai_invalid([dict(x) for x in e.errors()])
        raise FrameError("bad_input", message, 400, param=param) from None


async def _create(ws: WebSocket, svc: Services, who: str, frame: dict[str, Any], lane: dict[str, str],
                  kept: Kept) -> None:
    """One `response.create`: POST /v1/responses's submit, then its events, sent as they come.  A
    store-false response that ends is kept (Kept); one whose client left first is abandoned."""
    req = _request(frame)
    if (rid := req.previous_response_id) is not None and not kept.holds(rid):
        await run_sync(_persisted, svc, who, rid)
    try:
        job = await run_sync(submit, svc, who, req)
    except SetflowError as e:
        raise FrameError(e.code, e.message, errors.STATUS.get(e.code, 500),
                         retry_after_s=getattr(e, "retry_after_s", None)) from None
    except (redis.RedisError, OperationalError) as e:
        log.warning("response.create on a socket: store unavailable: %s", type(e).__name__)
        raise FrameError("unavailable", "the session store or the database is unavailable; retry shortly", 503,
                         retry_after_s=1) from None
    ended = False
    try:
        async with aclosing(events(svc, job, -1, drop=False)) as evs:
            async for ev in evs:
                if ev is not None:  # a keep-alive: the socket's own pings keep it (uvicorn's)
                    await _send(ws, ev, lane)
        ended = True
        kept.ended(job, req.store)  # no await before: a socket closed now cancels this turn
    finally:
        if not ended and not req.store:  # the client left before its end: nobody can read it now
            abandon(svc, job)


def _error(e: FrameError) -> dict[str, Any]:
    """OpenAI's `error` event of a WebSocket: the HTTP status and the error an HTTP request would get."""
    status = 400 if e.status == 422 else e.status
    err: dict[str, Any] = {"type": errors.OPENAI_TYPES.get(status, "server_error"), "code": e.code,
                           "message": e.message, "param": e.param}
    if e.retry_after_s is not None:
        err["retry_after_s"] = e.retry_after_s
    return {"type": "error", "status": status, "error": err}


async def _send(ws: WebSocket, ev: dict[str, Any], lane: dict[str, str]) -> None:
    await ws.send_text(json.dumps({**ev, **lane}, separators=(",", ":")))
