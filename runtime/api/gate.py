"""What a request must be before the app reads its body, checked in this order:

    a write (POST, PUT, PATCH, DELETE under /v1/) names a valid API key -> 401, nothing read
    -> its tenant is not over its rate (as this process last saw it)     -> 429, nothing read
    -> its body is at most max_body_bytes                                -> 413, read no further
    -> its body is UTF-8 (a Content-Type charset, and the body's bytes)    -> 415
    -> a JSON body's strings hold no lone surrogate (`\\ud800` alone)       -> 422 bad_input

and, innermost (after an Idempotency-Key's replay), a tenant's turn: its requests run at most
tenant_max_inflight at once in the process, the rest wait in order (Turns).  Before all of
them, a tenant over its share of the process while other tenants use it waits (Paced;
runtime/api/shares.py); a cancel after its accepted work goes at once.

A body is parsed only for a caller who may send one (a stranger's costs the service nothing but
a header lookup), and a JSON body is UTF-8 as RFC 8259 says: Python's json would decode UTF-16
and UTF-32 as well, a second meaning for the same route."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.api import errors
from runtime.api.auth import Unauthorized, tenant_of
from runtime.api.scope import RELEASE
from runtime.api.shares import ApiShares

WRITES = {"POST", "PUT", "PATCH", "DELETE"}
UTF8 = {"utf-8", "utf8", "us-ascii", "ascii"}  # charsets whose bytes are UTF-8 (ASCII is a subset)


def _replay(first: list[Message], receive: Receive) -> Receive:
    """`receive` with the messages already taken from it given back first, in order."""
    async def replayed() -> Message:
        return first.pop(0) if first else await receive()
    return replayed


class Authorized:
    """401 for a write without a valid API key, before its body is read; 429 for a write of a
    tenant over its rate (its bucket empty until its next token, as a refusal in this process
    said: RateLimiter.empty_for), before its body is read too.  A flood past the rate then
    costs a header lookup a request, not a parse, a check and a round trip to Redis."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in WRITES and scope["path"].startswith("/v1/"):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            services = scope["app"].state.services
            try:
                tenant = tenant_of(services.keyring, headers)
            except Unauthorized as e:
                await errors.body("unauthorized", str(e), 401, scope["path"])(scope, receive, send)
                return
            if (wait := services.limiter.empty_for(tenant)) > 0:
                await errors.body("rate_limited", str(services.limiter.refusal(tenant, wait)), 429, scope["path"],
                                  retry_after_s=wait)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Bounded:
    """413 for a request body past `limit` bytes: by its Content-Length when it has one, else
    (a chunked body) counted as it arrives, before the app sees any of it."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        size = next((v for k, v in scope["headers"] if k.lower() == b"content-length"), None)
        if size is not None:
            if not size.isdigit():
                await errors.body("bad_input", "Content-Length is not a number", 422, scope["path"])(scope, receive, send)
            elif int(size) > self.limit:
                await self._refuse(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        total, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body was complete: nobody to answer
            chunks.append(message.get("body", b""))
            total += len(chunks[-1])
            if total > self.limit:
                await self._refuse(scope, receive, send)
                return
            more = bool(message.get("more_body", False))
        whole: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await errors.body("too_large", f"a request body is at most {self.limit} bytes", 413,
                          scope["path"])(scope, receive, send)


def charset_problem(content_type: str, body: bytes) -> str | None:
    """Why a body of this Content-Type is not UTF-8, or None.  UTF-16 and UTF-32 show in the
    first 4 bytes (a BOM, or the zero bytes of ASCII characters), as json.detect_encoding reads
    them; any other charset, in bytes that do not decode."""
    for param in content_type.split(";")[1:]:
        name, _, value = param.strip().partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in UTF8:
            return f"a request body is UTF-8, not {value.strip()[:40]!r}"
    if body and json.detect_encoding(body[:4]) not in ("utf-8", "utf-8-sig"):
        return f"a request body is UTF-8, not {json.detect_encoding(body[:4]).upper()}"
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"a request body is UTF-8: byte {e.start} is not ({e.reason})"
    return None


#: in JSON text: an escaped backslash (skipped, so that `\\ud800` is text) or a surrogate's escape
_ESCAPE = re.compile(rb"\\(\\|u[dD][89a-fA-F][0-9a-fA-F]{2})")


def lone_surrogate(body: bytes) -> int | None:
    """The offset of a `\\uD800`-`\\uDFFF` escape in a JSON text that is not half of a pair, or
    None.  Python's json decodes one into a string no UTF-8 writer can write back (a later read
    of it fails); a pair is a character beyond the BMP, and fine."""
    pending = None  # (offset, end) of a high surrogate waiting for its low half
    for m in _ESCAPE.finditer(body):
        if m[1] == b"\\":
            continue
        high = m[1][2:3].lower() in b"89ab"
        if pending is not None and (high or m.start() != pending[1]):
            return pending[0]
        if not high and pending is None:
            return m.start()
        pending = (m.start(), m.end()) if high else None
    return None if pending is None else pending[0]


class Utf8:
    """415 for a body that is not UTF-8 (by its Content-Type's charset or its bytes); 422 for a
    JSON body with a lone surrogate.  The body (within max_body_bytes: Bounded is outside) is
    read whole, checked and handed on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in WRITES:
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body was complete: nobody to answer
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        content_type = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"content-type"), "")
        problem = charset_problem(content_type, body)
        status, code = 415, "unsupported_media_type"
        as_json = not content_type or "json" in content_type.lower()  # FastAPI reads a body with no type as JSON
        if problem is None and as_json and (at := lone_surrogate(body)) is not None:
            problem = f"a JSON string holds a lone surrogate (byte {at}): text is Unicode characters"
            status, code = 422, "bad_input"
        if problem is not None:
            await errors.body(code, problem, status, scope["path"])(scope, receive, send)
            return
        whole: Message = {"type": "http.request", "body": body, "more_body": False}
        await self.app(scope, _replay([whole], receive), send)


#: requests of one tenant waiting for a turn, per turn it has (beyond: 429)
WAITING_PER_TURN = 16


class Turns:
    """A tenant's requests run at most `inflight` at once in this process; the rest wait their
    turn, in order, holding no thread, up to WAITING_PER_TURN x inflight of them (429 beyond).

    Why: the API is one process, one GIL, one thread pool.  A tenant looping costly requests
    (10k-row uploads, forks, submissions) from many connections would otherwise hold as many
    threads and take the GIL from every other tenant's short request (bench/abuse.py, 60 s: the
    normal tenant's time outside its jobs' runs, submitting and reading, was 0.34 s at p50
    beside 11 loops of the abuser's, 0.19 s with turns).  With turns, another
    tenant's request shares the process with at most `inflight` of the flooder's, and a
    flood's own rate falls to what those turns can serve.  A turn is held until the response
    starts: an event stream's long body holds none, and a route that waits long (a response
    awaited on the loop) gives its turn back first (scope.release_turn).  Requests without a valid
    key pass (their 401 is cheap); so do the page, /docs and /healthz (not under /v1/).
    The time each request holds its turn is charged to its tenant's share of the process
    (runtime/api/shares.py: Paced holds a tenant over it at the door)."""

    def __init__(self, app: ASGIApp, inflight: int, shares: ApiShares | None = None) -> None:
        self.app = app
        self.inflight = inflight
        self.turns: dict[str, asyncio.Semaphore] = {}  # tenant -> its turns (tenants: the key map's, bounded)
        self.waiting: dict[str, int] = {}
        self.shares = shares if shares is not None else ApiShares(0.0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tenant = _tenant(scope)
        if tenant is None:
            await self.app(scope, receive, send)
            return
        turns = self.turns.setdefault(tenant, asyncio.Semaphore(self.inflight))
        if turns.locked() and self.waiting.get(tenant, 0) >= WAITING_PER_TURN * self.inflight:
            await errors.body("rate_limited", f"tenant {tenant!r} has {self.inflight} requests running and "
                              f"{WAITING_PER_TURN * self.inflight} waiting in this API process: retry later",
                              429, scope["path"], retry_after_s=1)(scope, receive, send)
            return
        self.waiting[tenant] = self.waiting.get(tenant, 0) + 1
        try:
            await turns.acquire()
        finally:
            self.waiting[tenant] -= 1
        held, since = True, time.monotonic()

        def release() -> None:
            nonlocal held
            if held:
                held = False
                turns.release()
                self.shares.charge(tenant, time.monotonic() - since)

        scope.setdefault("state", {})[RELEASE] = release

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                release()  # the answer is made: its body (a stream's, too) goes out without a turn
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            release()


class Paced:
    """Outermost: a tenant over its share of the process while other tenants use it
    (runtime/api/shares.py, charged by Turns) waits here before its request goes on, whatever
    it is (a submission, a read, a body that the next gates refuse: a refusal costs a request
    too, and a loop of them spins as fast as they are answered).  The wait holds no turn and
    no thread; WAITING_PER_TURN x `inflight` of a tenant's requests wait at once at most, 429
    beyond.  Requests without a valid key pass, as in Turns.

    But a cancel (POST .../cancel) goes on at once while its tenant has a credit: one per
    write of its that this process answered 2xx (a job accepted, a response created), at most
    WAITING_PER_TURN x `inflight` kept.  A cancel frees the work it follows, and one held at
    the door let that work run: a tenant looping submit + cancel had each job run to its end
    on a worker before its cancel arrived (bench/abuse.py: 897 of 909 jobs).  Its cancels are
    still charged to its share (Turns) and its next request waits for them; with a credit per
    answered write it cannot send more unpaced requests than paced ones."""

    def __init__(self, app: ASGIApp, shares: ApiShares, inflight: int) -> None:
        self.app = app
        self.shares = shares
        self.most = WAITING_PER_TURN * inflight
        self.waiting: dict[str, int] = {}
        self.credits: dict[str, int] = {}  # tenant -> cancels it may send past its wait (tenants: the key map's)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tenant = _tenant(scope)
        if tenant is None:
            await self.app(scope, receive, send)
            return
        wait = self.shares.wait_s(tenant)
        cancel = scope["method"] == "POST" and scope["path"].endswith("/cancel")
        if wait > 0 and cancel and self.credits.get(tenant, 0) > 0:
            self.credits[tenant] -= 1
            wait = 0.0
        if scope["method"] in WRITES and not cancel:
            send = self._crediting(tenant, send)
        if wait <= 0:
            await self.app(scope, receive, send)
            return
        if self.waiting.get(tenant, 0) >= self.most:
            await errors.body("rate_limited", f"tenant {tenant!r} is over its share of this API process while other "
                              f"tenants use it, and has {self.most} requests waiting: retry later", 429, scope["path"],
                              retry_after_s=math.ceil(wait))(scope, receive, send)
            return
        self.waiting[tenant] = self.waiting.get(tenant, 0) + 1
        try:
            await asyncio.sleep(wait)
        finally:
            self.waiting[tenant] -= 1
        await self.app(scope, receive, send)

    def _crediting(self, tenant: str, send: Send) -> Send:
        """`send`, crediting the tenant a cancel if the answer is a 2xx."""
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and 200 <= message["status"] < 300:
                self.credits[tenant] = min(self.most, self.credits.get(tenant, 0) + 1)
            await send(message)
        return sending


def _tenant(scope: Scope) -> str | None:
    """The tenant of a /v1/ request with a valid key (None: any other)."""
    if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
        return None
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    try:
        return tenant_of(scope["app"].state.services.keyring, headers)
    except Unauthorized:
        return None

