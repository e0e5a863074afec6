"""One worker process's runtime, built once in the pool process (when it is forked, else on its
first job) and kept for the process's life:
the model (Settings.model_dir, else the shipped one) with its profile, on its device (CUDA with
bf16 when present, else CPU with capped torch threads; Settings.dtype), the
engine with its warm sessions, clients of Redis and the database, and the dispatcher over the
`send` its caller hands in (workers/tasks.py hands in Celery's: nothing here knows Celery).
Once built, its model's card (fingerprint, config, tokenizer) is published for the API
(runtime/jobs/hosts.py).
Celery's prefork pool forks before the first job, so nothing here (torch above all) is loaded in
the parent."""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys
import threading

import redis
import torch

from model import profiles, shipped
from model.linear import invariant_threads
from model.pool import KVPool
from model.transformer import SetDLM
from runtime.db import make_engine
from runtime.embedded import client as redis_client
from runtime.jobs import hosts
from runtime.jobs.dispatch import Dispatcher, Send
from runtime.jobs.hosts import Host
from runtime.jobs.rows import Jobs
from runtime.sessions.batcher import Batcher
from runtime.sessions.engine import Engine
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from workers.runner import Runtime

log = logging.getLogger("setflow.worker")


_runtime: Runtime | None = None
_building = threading.Lock()
EXIT_BATCH_LOOP_DIED = 70  # EX_SOFTWARE: the batch loop died (_exit)


def worker_name(settings: Settings) -> str:
    return settings.worker_name or f"{socket.gethostname()}-{os.getpid()}"


def device(settings: Settings) -> tuple[str, torch.dtype]:
    cuda = torch.cuda.is_available() if settings.device == "auto" else settings.device == "cuda"
    dev = "cuda" if cuda else "cpu"
    return dev, getattr(torch, settings.numerics(dev).split("/")[1])


def runtime(send: Send) -> Runtime:
    """This process's runtime, built on the first call; send: how a job id reaches its queue."""
    global _runtime
    with _building:  # a batching worker's job threads may all ask at once
        if _runtime is None:
            _runtime = _build(send)
        return _runtime


def engine(model: SetDLM, store: SessionStore, records: Records, s: Settings) -> Engine:
    """One turn at a time (batch_sessions 1), or a batcher over a paged KV pool of the blocks
    kv_pool_bytes holds, at least batch_sessions whole contexts' (model/pool.py: a session
    running or warm holds the blocks of its tokens; the warm LRU gives them back on demand)."""
    batch = s.batch_sessions or 1  # `setflow worker` sets it (Settings.batch_size)
    if batch == 1:
        return Engine(model, store, records, s)
    w = next(model.parameters())
    cfg = model.cfg
    pool = KVPool.of_bytes(cfg, s.kv_pool_bytes, dtype=w.dtype, device=w.device, contexts=batch)
    return Engine(model, store, records, s, warm_sessions=pool.blocks, batcher=Batcher(model, batch, on_death=_exit),
                  pool=pool)


def _exit(error: BaseException) -> None:
    """The batch loop died (a bug; it has logged it): this worker can decode nothing more.  It
    exits at once as a crash would, recording nothing, and its jobs' leases lapse: the other
    workers take them over and finish them token-identical (as after a kill -9), where staying
    up would fail every job routed here."""
    sys.stderr.flush()
    os._exit(EXIT_BATCH_LOOP_DIED)


def _invariant(model: SetDLM, dtype: torch.dtype, threads: int) -> None:
    """Torch threads at a count where the model's products are row-invariant (model/linear.py):
    the same tokens batched and alone, restored and recomputed.  Fewer than torch_threads where
    that count cannot be (a warning says so); none at all, an error in the log: turns then agree
    only to float tolerance."""
    got = invariant_threads(model.shapes, dtype, threads)
    if got is None:
        log.error("no torch thread count keeps this model's products row-invariant on this CPU: batched, "
                  "restored and recomputed turns agree only to float tolerance, not bit for bit")
    elif got != threads:
        log.warning("torch_threads %d: this CPU's BLAS is not row-invariant for this model's shapes at that "
                    "count; running %d thread(s) a process, where it is (the same tokens batched and alone)",
                    threads, got)


def _build(send: Send) -> Runtime:
    s = Settings()
    torch.set_num_threads(s.torch_threads)  # several processes share the cores: 4x slower without
    dev, dtype = device(s)
    folder = s.model_dir or shipped.SHIPPED
    model, tok = shipped.load(folder, device=dev, dtype=dtype)
    if dev == "cpu":
        _invariant(model, dtype, s.torch_threads)
    profile = profiles.load(folder, model.cfg, tok)
    client = redis_client(s)
    sql = make_engine(s)
    jobs = Jobs(sql, s)
    eng = engine(model, SessionStore(client, s), Records(sql, s), s)
    try:  # the restore-or-recompute cost model, measured now rather than inside a first turn's load
        eng.rates()
    except redis.RedisError:
        pass  # Redis is away: measured at the first turn that needs it
    # what the API checks submissions against (vocabulary, context) and decodes text with: now,
    # and again whenever Redis lost it (away at the start, or restarted empty)
    # and which model and numerics this worker hosts (with the card, every heartbeat): what
    # submissions are bound to and routed by
    name, host = worker_name(s), Host(eng.model_name, eng.fp, eng.numerics)
    hosts.keep_published(client, s, hosts.ModelCard(eng.fp, model.cfg, tok.to_str(), profile.to_json()),
                          every_s=s.worker_heartbeat_s, stop=threading.Event(), host=(name, host))
    gc.collect()  # the model, its tokenizer and their tables are here for the process's life: a full
    gc.freeze()  # collection's walk of them (300K objects) was a pause of 250-560 ms inside a step
    return Runtime(s, name, eng, tok, jobs, Dispatcher(client, jobs, send), profile, host)
