"""Idempotent POSTs: a request with an `Idempotency-Key` header is answered once per tenant and
key; the same key again, with the same body to the same route, within idempotency_ttl_s, gets
that first answer replayed (`Idempotent-Replayed: true`): a client that timed out and retries
cannot submit twice.  The same key with another body or route is refused (idempotency_mismatch)
and changes nothing.

    the key row is inserted first (its primary key (tenant, key) decides a race: one request
    runs the route, the duplicates wait for its answer and replay it)
    -> the route runs -> its answer is stored in the row (a 2xx, and a 4xx too: the same request
       gets the same refusal, as Stripe does); an answer that says "retry later" (a 5xx, a 429,
       anything with Retry-After) or a failure deletes the row, so that a retry runs the request
       again

The body is compared as the bytes sent (sha256): a client retries with the bytes it sent.  A
stream (POST /v1/responses with stream) is kept as the response it streams (the route names it
in a header); its replay streams that response's events again from the start.  Keys live in SQL
(runtime/api/idempotency_keys.py) and survive restarts; rows past their TTL are pruned a
batch at a time as new keys come.  A row still in flight long after any request could have
answered (ABANDONED_S past response_wait_s: its process died mid-request) is taken over by the
next request with its key, rather than holding the key for the whole TTL.

A duplicate pays at the door like any request: it takes a rate-limit token; at most
MAX_WAITING of a tenant's duplicates wait at once in a process (429 beyond); a waiting one wakes
on the first request's answer (an event in this process; a check of SQL each POLL_S for a first
request in another process) and stops when its client leaves.  A tenant holds at most
idempotency_max_keys keys within their TTL (a new key past it: 429 rate_limited), and a kept
answer is at most MAX_ANSWER bytes (a larger one is not kept: a retry runs again)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any

import redis
from anyio.to_thread import run_sync
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.api import errors
from runtime.api.auth import Unauthorized, tenant_of
from runtime.api.idempotency_keys import Keys
from runtime.api.scope import STREAMED, UNKEPT
from runtime.errors import RateLimited
from runtime.tables import IdempotencyRecord

HEADER = "idempotency-key"
WAIT_S = 60.0  # a duplicate waits this long for the first request's answer (then 409 in_flight)
POLL_S = 1.0  # a waiting duplicate checks SQL this often (a first request in another process)
MAX_WAITING = 8  # a tenant's duplicates waiting at once in one process
MAX_ANSWER = 256 * 1024  # bytes of an answer kept for replay
#: an in-flight row older than response_wait_s (the longest a POST runs: one that waits for its
#: response) plus this was left by a process that died mid-request: the next request takes it over
ABANDONED_S = 60.0


_LEFT = object()  # a wait that answered its client itself, or lost it
#: (tenant, key) -> the event its first request, running in this process, sets when it has
#: answered or released the key (an entry lives as long as that request)
_FLIGHTS: dict[tuple[str, str], asyncio.Event] = {}


def _key_problem(key: str) -> str | None:
    if not 1 <= len(key) <= 255 or not all(33 <= ord(c) <= 126 for c in key):
        return "an Idempotency-Key is 1-255 visible ASCII characters (no spaces)"
    return None


class Idempotent:
    """The ASGI middleware: POSTs with an Idempotency-Key, after their tenant is known (an
    unauthenticated request passes through to its 401 and writes no key)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        key = headers.get(HEADER)
        if key is None:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        svc = scope["app"].state.services
        try:
            tenant = tenant_of(svc.keyring, headers)
        except Unauthorized:
            await self.app(scope, receive, send)
            return
        why = _key_problem(key)
        if why is not None:
            await errors.body("bad_input", why, 422, path)(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            more = bool(message.get("more_body", False))
        keys = Keys(svc.sql, svc.settings.idempotency_ttl_s, svc.settings.response_wait_s + ABANDONED_S,
                    svc.settings.idempotency_max_keys, svc.settings)
        route, digest = f"POST {path}", hashlib.sha256(body).hexdigest()
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                held = await run_sync(keys.claim, tenant, key, route, digest)
            except RateLimited as e:
                await errors.body(e.code, e.message, 429, path, retry_after_s=e.retry_after_s)(scope, receive, send)
                return
            if held is None:
                break  # ours: run it
            if held.route != route or held.body_hash != digest:
                await errors.body("idempotency_mismatch", f"Idempotency-Key {key!r} was used for another request "
                                  f"({held.route}, another body): use a new key for a new request", 422,
                                  path)(scope, receive, send)
                return
            try:
                await run_sync(svc.limiter.take, tenant)  # a duplicate pays at the door as any request
            except RateLimited as e:
                await errors.body(e.code, e.message, 429, path, retry_after_s=e.retry_after_s)(scope, receive, send)
                return
            except redis.RedisError:
                await errors.body("unavailable", "the session store (Redis) is unavailable; retry shortly", 503, path,
                                  retry_after_s=1.0)(scope, receive, send)
                return
            if held.status is None:
                held = await self._wait(scope, receive, send, keys, tenant, key, deadline)
                if held is _LEFT:
                    return  # its client left, or it was refused: nothing more to do
            if held is None:
                continue  # the first failed (its row released): this one runs it
            if held.status is None:
                await errors.body("idempotency_in_flight", f"a request with Idempotency-Key {key!r} is still "
                                  "running: retry later", 409, path, retry_after_s=1.0)(scope, receive, send)
                return
            await self._replay(scope, receive, send, held)
            return
        done = _FLIGHTS[(tenant, key)] = asyncio.Event()
        try:
            await self._run(scope, receive, send, body, keys, tenant, key)
        finally:
            done.set()  # its duplicates in this process read the answer now
            if _FLIGHTS.get((tenant, key)) is done:
                del _FLIGHTS[(tenant, key)]

    #: a tenant's duplicates waiting in this process
    _waiting: dict[str, int] = {}

    async def _wait(self, scope: Scope, receive: Receive, send: Send, keys: Keys, tenant: str, key: str,
                    deadline: float) -> Any:
        """The row of the first request once it answered or released its key (None), or still in
        flight at the deadline; _LEFT when the client left or the tenant has MAX_WAITING waiting."""
        if self._waiting.get(tenant, 0) >= MAX_WAITING:
            await errors.body("rate_limited", f"tenant {tenant!r} has {MAX_WAITING} requests waiting on "
                              "Idempotency-Keys in flight: retry later", 429, scope["path"],
                              retry_after_s=1.0)(scope, receive, send)
            return _LEFT
        self._waiting[tenant] = self._waiting.get(tenant, 0) + 1
        left = asyncio.ensure_future(receive())  # the body is read: what comes next is the client leaving
        try:
            while True:
                first = _FLIGHTS.get((tenant, key))  # None: the first request runs in another process
                woke = asyncio.ensure_future(first.wait()) if first is not None else None
                await asyncio.wait({left} | ({woke} if woke else set()),
                                   timeout=max(0.0, min(POLL_S, deadline - time.monotonic())),
                                   return_when=asyncio.FIRST_COMPLETED)
                if woke is not None:
                    woke.cancel()
                if left.done() and left.result().get("type") == "http.disconnect":
                    return _LEFT
                held = await run_sync(keys.get, tenant, key)
                if held is None or held.status is not None or time.monotonic() >= deadline:
                    return held
        finally:
            left.cancel()
            self._waiting[tenant] -= 1
            if not self._waiting[tenant]:
                del self._waiting[tenant]

    async def _run(self, scope: Scope, receive: Receive, send: Send, body: bytes, keys: Keys, tenant: str,
                   key: str) -> None:
        """Run the request, its answer kept (a 5xx, or a failure, releases the key)."""
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # what comes after the body: the client's disconnect (a stream listens)

        start: dict[str, Any] = {}
        chunks: list[bytes] = []
        kept = False

        async def keep(message: Message) -> None:
            nonlocal kept
            if message["type"] == "http.response.start":
                start.update(message)
                hs = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", [])}
                if UNKEPT in hs:
                    message = {**message, "headers": [(k, v) for k, v in message.get("headers", [])
                                                      if k.decode("latin-1").lower() != UNKEPT]}
                status = int(message["status"])
                if status >= 500 or status == 429 or "retry-after" in hs:  # "retry later": a retry must run
                    await run_sync(keys.release, tenant, key)
                    kept = True
                elif STREAMED in hs:  # a stream: kept as the response it streams
                    await run_sync(keys.answer, tenant, key, status, {"stream": hs[STREAMED]})
                    kept = True
            elif message["type"] == "http.response.body" and not kept:
                chunks.append(message.get("body", b""))
                if sum(map(len, chunks)) > MAX_ANSWER:  # too large to keep: a retry runs it again
                    await run_sync(keys.release, tenant, key)
                    kept = True
                elif not message.get("more_body", False):
                    hs = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in start.get("headers", [])}
                    await run_sync(keys.answer, tenant, key, int(start["status"]),
                                   {"body": _without(b"".join(chunks), hs.get(UNKEPT, "")).decode("utf-8", "replace"),
                                    "type": hs.get("content-type", "application/json")})
                    kept = True
            await send(message)

        try:
            await self.app(scope, replay, keep)
        except BaseException:
            if not kept:
                await run_sync(keys.release, tenant, key)
            raise
        if not kept:  # no answer came (the client went away mid-way): a retry runs it again
            await run_sync(keys.release, tenant, key)

    async def _replay(self, scope: Scope, receive: Receive, send: Send, held: IdempotencyRecord) -> None:
        answer = held.answer or {}
        if "stream" in answer:  # the response's events again, from the start
            rid = answer["stream"]
            again = {**scope, "method": "GET", "path": f"/v1/responses/{rid}", "raw_path": f"/v1/responses/{rid}".encode(),
                     "query_string": b"stream=true",
                     "headers": [(k, v) for k, v in scope["headers"] if k.lower() not in (b"content-length",)]}

            done = False

            async def nothing() -> Message:
                nonlocal done
                if not done:
                    done = True
                    return {"type": "http.request", "body": b"", "more_body": False}
                return await receive()

            async def mark(message: Message) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []), (b"idempotent-replayed", b"true")]}
                await send(message)

            await self.app(again, nothing, mark)
            return
        body = str(answer.get("body", "")).encode()
        await send({"type": "http.response.start", "status": int(held.status or 200),
                    "headers": [(b"content-type", str(answer.get("type", "application/json")).encode()),
                                (b"content-length", str(len(body)).encode()), (b"idempotent-replayed", b"true")]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _without(body: bytes, unkept: str) -> bytes:
    """A JSON answer without the top-level fields `unkept` names (comma-separated); an answer
    that is not a JSON object keeps nothing ({})."""
    names = {n.strip() for n in unkept.split(",") if n.strip()}
    if not names:
        return body
    try:
        answer = json.loads(body)
    except ValueError:
        return b"{}"
    if not isinstance(answer, dict):
        return b"{}"
    return json.dumps({k: v for k, v in answer.items() if k not in names}, separators=(",", ":")).encode()
