"""The FastAPI app: `create_app(settings)`.  Routes: sessions.py, jobs.py, ops.py, page.py;
errors as JSON with stable codes: errors.py; API keys: auth.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import redis
from fastapi import FastAPI, Request, Response

from runtime.api import errors, jobs, ops, page, sessions
from runtime.api.services import Services
from runtime.dispatch import Send
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


def create_app(settings: Settings, client: redis.Redis | None = None, send: Send | None = None) -> FastAPI:
    """client: the Redis client (default: from settings.redis_url, which must be set: `setflow
    serve` starts the embedded server first when it is not); send: how jobs reach Celery."""
    if client is None:
        if settings.redis_url is None:
            raise ValueError("the API needs a redis_url (setflow serve starts the embedded Redis when none is set)")
        client = redis.Redis.from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=5)
    svc = Services.build(settings, client, send)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        svc.close()

    app = FastAPI(title="setflow", version="0.1.0", description=DESCRIPTION, lifespan=lifespan)
    app.state.services = svc
    errors.install(app)

    @app.middleware("http")
    async def bounded(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > settings.max_body_bytes):
            return errors.body("too_large", f"a request body is at most {settings.max_body_bytes} bytes", 413)
        return await call_next(request)

    for r in (sessions.router, jobs.router, ops.router, page.router):
        app.include_router(r)
    return app
