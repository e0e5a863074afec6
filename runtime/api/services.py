"""What the API's routes use, built once per app from Settings: the Redis client, the SQL
engine and its stores, the dispatcher (with the sender it is handed: the API imports no Celery),
and the model cards workers publish (vocabulary, context, tokenizer: no model file, no torch)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aioredis
from anyio import CancelScope, CapacityLimiter
from pydantic import BaseModel
from sqlalchemy import Engine

from model.tokenizer import Tokenizer
from runtime.api.auth import KeyRing
from runtime.db import make_engine
from runtime.embedded import async_from_url
from runtime.errors import BadInput, RateLimited
from runtime.jobs.datasets import Datasets
from runtime.jobs.dispatch import Admission, Dispatcher, Send
from runtime.jobs.fairness import RateLimiter
from runtime.jobs.hosts import Cards, Host, Hosts
from runtime.jobs.kinds import check_spec
from runtime.jobs.rows import Jobs
from runtime.jobs.specs import AgentSpec
from runtime.keys import Keys, model_name
from runtime.sessions.metrics import TurnMetrics
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from runtime.tables import JobRecord
from workflows import check_fits, positions
from workflows.turn import check_ids

STREAM_RETRY_S = 15.0  # a stream refused at the cap: the Retry-After it is told


@dataclass
class Services:
    settings: Settings
    client: redis.Redis
    sql: Engine
    records: Records
    jobs: Jobs
    dispatcher: Dispatcher
    store: SessionStore
    limiter: RateLimiter
    metrics: TurnMetrics
    cards: Cards
    keys: Keys
    keyring: KeyRing  # the API keys, hashed (settings.api_keys is emptied: no key kept in clear)
    datasets: Datasets
    streams: dict[str, int] = field(default_factory=dict)  # tenant -> event streams open (this process)
    #: dataset uploads parsed at once, on worker threads (10k rows: 0.04-0.11 s of Python each):
    #: more would only take the GIL from the event loop (10 clients uploading: /healthz p99 2.3 s
    #: with 10 at once, 0.4 s with 1); the others wait on the loop, holding no thread
    parsing: CapacityLimiter = field(default_factory=lambda: CapacityLimiter(1))

    @classmethod
    def build(cls, settings: Settings, client: redis.Redis, send: Send) -> Services:
        """send: how a job id reaches its queue (app/serve.py hands in Celery's send_task by name)."""
        keyring = KeyRing(settings.api_keys)
        settings = settings.model_copy(update={"api_keys": {}})
        sql = make_engine(settings)
        jobs = Jobs(sql, settings)
        return cls(settings, client, sql, Records(sql, settings), jobs, Dispatcher(client, jobs, send),
                   SessionStore(client, settings), RateLimiter(client, settings), TurnMetrics(client, settings),
                   Cards(client, settings), Keys(settings.key_prefix), keyring, Datasets(sql, settings.tenant_max_datasets))

    def aclient(self) -> aioredis.Redis:
        """An async Redis client for one event stream (it waits on it without holding a
        thread), closed by the stream (close_fully): its connection belongs to the loop that runs the stream,
        whichever that is (uvicorn's; a test's).  A connection per open stream, and those are
        capped per tenant.  A finite socket timeout: a half-open connection fails the read
        (retried) instead of hanging the stream."""
        url = self.settings.redis_url or _url(self.client)
        return async_from_url(url, isinstance(self.client, redis.RedisCluster), socket_timeout=5,
                              socket_connect_timeout=5)

    async def aclose(self) -> None:
        """At the app's shutdown."""
        self.close()

    @contextmanager
    def stream_slot(self, tenant: str) -> Iterator[None]:
        """One of the tenant's event streams (or waits, which hold as much) while inside, checked
        and counted in one step (no await between): RateLimited at entry where none is free."""
        self.stream_room(tenant)
        self.streams[tenant] = self.streams.get(tenant, 0) + 1
        try:
            yield
        finally:
            self.streams[tenant] -= 1

    def stream_room(self, tenant: str) -> None:
        """RateLimited where one more event stream cannot open now (streams_full says why): a
        route's 429 before its stream starts, which takes its slot (stream_slot) when it does."""
        if (full := self.streams_full(tenant)) is not None:
            raise RateLimited(full, retry_after_s=STREAM_RETRY_S)

    def streams_full(self, tenant: str) -> str | None:
        """Why one more event stream cannot open in this process for the tenant: it holds
        max_streams_per_tenant, or all tenants together hold max_streams; None when it can."""
        s = self.settings
        if self.streams.get(tenant, 0) >= s.max_streams_per_tenant:
            return f"tenant {tenant!r} holds {s.max_streams_per_tenant} event streams open already"
        if sum(self.streams.values()) >= s.max_streams:
            return f"this API process holds {s.max_streams} event streams open already (max_streams)"
        return None

    def submit(self, kind: str, tenant: str, spec: dict[str, Any], session: str | None, priority: str,
               open_session: bool = False, model: str | None = None, numerics: str | None = None) -> JobRecord:
        """Dispatcher.submit with the API's own checks of the parsed spec: which model runs it
        (`host`) and whether it fits that model (`fits`); nothing is written for a job refused."""
        def admit(parsed: BaseModel) -> Admission:  # after the spec's checks; its host binds the session
            if isinstance(parsed, AgentSpec) and parsed.dataset is not None:
                self.datasets.exists(tenant, parsed.dataset)  # NotFound: the tenant has no such dataset
            host = self.host(session, tenant, model, numerics)
            return Admission(host, self.fits(kind, parsed, session, tenant, host))

        return self.dispatcher.submit(kind, tenant, spec, session, priority, open_session, admit=admit)

    def host(self, session: str | None, tenant: str, model: str | None, numerics: str | None) -> Host | None:
        """What the job runs on: its session's model and numerics where it is bound to them, else
        `model` (default: Settings.default_model, else the model most live workers host, else
        the current card's) in `numerics`, as a live worker hosts it.  ModelNotHosted where
        none does; None (any worker, the session bound by its first turn) where no worker says
        what it hosts and the job names no model (workers of an earlier version, or none
        started yet: its jobs wait in the queue)."""
        hosts = Hosts(self.client, self.settings)
        if session is not None:
            rec = self.records.get_session(session, tenant)  # NotFound first
            if rec.model:
                if model is not None and model != rec.model:
                    raise BadInput(f"session {session} runs model {rec.model}, not {model}")
                return hosts.require(rec.model, rec.numerics, rec.model_fingerprint)
        if model is None and numerics is None and not hosts.live():
            return None
        name = (model or self.settings.default_model or hosts.most_hosted(numerics)
                or model_name(self.cards.require().config.name))
        return hosts.choose(name, numerics)

    def fits(self, kind: str, spec: BaseModel, session: str | None, tenant: str, host: Host | None = None) -> int:
        """The positions the job appends to its session at most (kept with it: the next job's
        check adds it up rather than planning it again).  BadInput when the job cannot fit the
        session's context or names a token id the model has not; NotFound for another tenant's
        session; NoModel where no worker has published its model (its vocabulary and context
        are not known).  host: the model it runs on (None: the current card's)."""
        card = self.cards.of(host.fingerprint) if host is not None else None
        card = card if card is not None else self.cards.require()
        check_ids(spec, card.config)
        used = 0
        if session is not None:  # what it holds, and what the jobs queued or running on it will add
            ahead = self.jobs.planned(session)
            used = self.records.length(session, tenant, except_jobs={j for j, _ in ahead})
            used += sum(n for _, n in ahead if n is not None)
            for j in self.jobs.specs([j for j, n in ahead if n is None]):  # not planned at their submission
                try:
                    used += positions(j.kind, check_spec(j.kind, j.spec, session), card.tokenizer, card.profile)
                except BadInput:
                    pass  # a stored spec that no longer checks: its job fails without writing
        return check_fits(kind, spec, card.tokenizer, used, card.config.max_seq_len, card.profile)

    def tokenizer(self, fingerprint: str = "") -> Tokenizer | None:
        """The tokenizer of the model a session was bound to (its fingerprint; "": none yet),
        else the current model's; None where no worker has published one."""
        card = self.cards.of(fingerprint) if fingerprint else None
        if card is None:
            card = self.cards.current()
        return card.tokenizer if card is not None else None

    def close(self) -> None:
        """The synchronous side; idempotent."""
        self.sql.dispose()
        self.client.close()


async def close_fully(client: aioredis.Redis) -> None:
    """Close an event stream's async client to the end, even while the stream is cancelled (its
    HTTP client left): anyio cancels every await in a cancelled scope, a plain `aclose()` too,
    which leaves the open socket to the garbage collector, maybe after its loop has closed.
    Bounded: a connection's close waits at most its socket_connect_timeout."""
    with CancelScope(shield=True):
        await client.aclose()


def _url(client: redis.Redis) -> str:
    """A URL for the sync client's server (when the settings name none: a client handed in)."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
