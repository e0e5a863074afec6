"""The FastAPI app: `create_app(settings, send=...)`.  Routes: routes/<resource>.py, their
parameters: deps.py; errors as JSON with stable codes: errors.py; API keys: auth.py; what a
request must be before its body is read: gate.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
from fastapi import FastAPI

from runtime.api import errors, gate
from runtime.api.idempotency import Idempotent
from runtime.api.openai import routes as responses
from runtime.api.openai.websocket import router as response_socket
from runtime.api.routes import (
    conversations,
    datasets,
    docs,
    exports,
    jobs,
    models,
    ops,
    page,
    schedules,
    sessions,
    webhooks,
)
from runtime.api.services import Services
from runtime.api.shares import ApiShares
from runtime.embedded import from_url
from runtime.jobs.dispatch import Send
from runtime.sessions import budget
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
    one line) where one tenant's budgets exceed Redis's maxmemory (runtime/sessions/budget.py)."""
    if client is None:
        if settings.redis_url is None:
            raise ValueError("the API needs a redis_url (setflow serve starts the embedded Redis when none is set)")
        client = from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=5)
    budget.check(client, settings)  # CliError where one tenant's budgets exceed Redis's maxmemory
    svc = Services.build(settings, client, send)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await svc.aclose()

    app = FastAPI(title="setflow", version="0.1.0", description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None)  # /docs: routes/docs.py, its assets served from here
    app.state.services = svc
    errors.install(app)

    # outermost last: a tenant over its share of the process waits, then a write's API key, its
    # body's size, its charset (runtime/api/gate.py), each before anything reads the body; then a
    # keyed retry's replay; then the tenant's turn (inside the replay: a retry waiting for its
    # first request's answer holds no turn)
    shares = ApiShares(settings.tenant_fair_window_s)  # charged by Turns, held to by Paced
    app.add_middleware(gate.Turns, inflight=settings.tenant_max_inflight, shares=shares)
    app.add_middleware(Idempotent)
    app.add_middleware(gate.Utf8)
    app.add_middleware(gate.Bounded, limit=settings.max_body_bytes)
    app.add_middleware(gate.Authorized)
    app.add_middleware(gate.Paced, shares=shares, inflight=settings.tenant_max_inflight)
    app.add_middleware(errors.Caught)  # outermost: whatever escapes is a JSON 500 and one log line

    for r in (sessions.router, jobs.router, exports.router, datasets.router, responses.router, response_socket, conversations.router,
              models.router, webhooks.router, schedules.router, ops.router, page.router, docs.router):
        app.include_router(r)
    app.mount(docs.ASSETS, docs.assets)
    return app
