"""The FastAPI app: `create_app(settings, send=...)`.  Routes: routes/{sessions,jobs,ops,page}.py,
their parameters: deps.py; errors as JSON with stable codes: errors.py; API keys: auth.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope
from starlette.types import Send as AsgiSend

from runtime.api import errors
from runtime.api.idempotency import Idempotent
from runtime.api.routes import conversations, datasets, jobs, models, ops, page, responses, schedules, sessions, webhooks
from runtime.api.services import Services
from runtime.embedded import from_url
from runtime.jobs.dispatch import Send
from runtime.sessions import ceilings
from runtime.settings import Settings

DESCRIPTION = """\
setflow runs a set-diffusion language model over long-lived sessions: each session's KV cache
lives in Redis, so any worker resumes it without re-reading its history.

Authenticate with `Authorization: Bearer <API key>` (or `X-API-Key`); a key belongs to one
tenant, and another tenant's sessions and jobs do not exist for it (404).  Errors are
`{"error": {"code", "message"}}` with a stable code; submissions past the tenant's rate get
429 with `Retry-After`.  Work is asynchronous: a turn, an infill or a job returns 202 with the
job; follow it with `GET /v1/jobs/{id}` or its server-sent events.
"""


def create_app(settings: Settings, client: redis.Redis | None = None, *, send: Send) -> FastAPI:
    """client: the Redis client (default: from settings.redis_url, which must be set: `setflow
    serve` starts the embedded server first when it is not); send: how a job id reaches its
    queue (app/serve.py hands in Celery's: the API imports no worker code).  Refused (CliError,
    one line) where one tenant's budgets exceed Redis's maxmemory (runtime/sessions/ceilings.py)."""
    if client is None:
        if settings.redis_url is None:
            raise ValueError("the API needs a redis_url (setflow serve starts the embedded Redis when none is set)")
        client = from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=5)
    ceilings.check(client, settings)  # CliError where one tenant's budgets exceed Redis's maxmemory
    svc = Services.build(settings, client, send)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await svc.aclose()

    app = FastAPI(title="setflow", version="0.1.0", description=DESCRIPTION, lifespan=lifespan)
    app.state.services = svc
    errors.install(app)

    app.add_middleware(Idempotent)  # inside Bounded: a body past the limit is refused before it is read
    app.add_middleware(Bounded, limit=settings.max_body_bytes)

    for r in (sessions.router, jobs.router, datasets.router, responses.router, conversations.router, models.router,
              webhooks.router, schedules.router, ops.router, page.router):
        app.include_router(r)
    return app


class Bounded:
    """413 for a request body past `limit` bytes: by its Content-Length when it has one, else
    (a chunked body) counted as it arrives, before the app sees any of it."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: AsgiSend) -> None:
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
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: AsgiSend) -> None:
        await errors.body("too_large", f"a request body is at most {self.limit} bytes", 413,
                          scope["path"])(scope, receive, send)
