"""runtime/jobs/hosts.py with routing and dispatch on a real Redis and a real database: a mixed
fleet (two models, two numerics of one of them) as its workers publish it.  A session is bound
to a model and numerics at its first job; its jobs go only to queues that workers hosting them
serve; a model (or numerics) nobody hosts is refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from runtime.db import make_engine
from runtime.errors import ModelNotHosted
from runtime.jobs.dispatch import Dispatcher
from runtime.jobs.hosts import Host, Hosts
from runtime.jobs.routing import consumed_by
from runtime.jobs.rows import Jobs
from runtime.sessions.records import Records
from runtime.settings import Settings
from tests.runtime.jobs.test_dispatch import SPEC, Sent

CPU = Host("small", "a" * 16, "cpu/float32")
GPU = Host("small", "b" * 16, "cuda/bfloat16")
QWEN = Host("qwen-tiny", "c" * 16, "cpu/float32")
FLEET = {"w-cpu": CPU, "w-cpu2": CPU, "w-gpu": GPU, "w-qwen": QWEN}


@pytest.fixture
def fleet(client: redis.Redis, settings: Settings, tmp_path: Path) -> tuple[Dispatcher, Sent, Hosts]:
    s = settings.model_copy(update={"data_dir": tmp_path, "worker_heartbeat_s": 5.0})
    d = Dispatcher(client, Jobs(make_engine(s), s), sent := Sent())
    hosts = Hosts(client, s)
    for worker, host in FLEET.items():  # what each worker's runtime says with its heartbeat
        d.routing.beat(worker)
        hosts.beat(worker, host)
    return d, sent, hosts


def serves(d: Dispatcher, worker: str, queue: str) -> bool:
    return queue in consumed_by(d.s, worker, FLEET[worker].pool)


def test_jobs_go_only_to_workers_that_host_their_sessions_model_and_numerics(
        fleet: tuple[Dispatcher, Sent, Hosts]) -> None:
    d, sent, hosts = fleet
    assert sorted(h.id for h in hosts.live()) == sorted({h.id for h in FLEET.values()})
    assert hosts.of("w-gpu") == GPU and hosts.workers(CPU) == ["w-cpu", "w-cpu2"]
    assert hosts.choose("small") == CPU  # no numerics asked: those most of its workers run
    for worker in FLEET:  # each runs a job: nobody idle, the pools' shared queues (Routing.idle below)
        d.routing.running(worker, {"globex": 1})
    placed = {}
    for host in (CPU, GPU, QWEN):
        job = d.submit("turn", "acme", SPEC, open_session=True, host=hosts.choose(host.model, host.numerics))
        rec = Records(d.jobs.engine).get_session(job.session_id or "", "acme")
        assert (rec.model, rec.numerics, rec.model_fingerprint) == (host.model, host.numerics, host.fingerprint)
        queue = sent[-1][1]
        assert job.pool == host.pool and queue == d.routing.shared("interactive", host.pool)
        assert {w for w in FLEET if serves(d, w, queue)} == {w for w, h in FLEET.items() if h == host}
        placed[host] = job.session_id or ""
        d.jobs.cancel(job.id, "acme")  # ended: the session's next job is sent when submitted
    # a CPU fp32 session's next job: not to the GPU worker's own queue even if it ran there last
    d.routing.touch(placed[CPU], "w-gpu")
    job = d.submit("turn", "acme", SPEC, placed[CPU])
    assert job.pool == CPU.pool and sent[-1][1] == d.routing.shared("interactive", CPU.pool)
    d.routing.touch(placed[CPU], "w-cpu2")  # warm on a worker of its pool: affinity holds
    d.jobs.cancel(job.id, "acme")
    warm = d.submit("turn", "acme", SPEC, placed[CPU])
    assert sent[-1][1] == d.routing.own("w-cpu2")
    # batch jobs too, and the reaper resends to the pool's queue, never the unbound one
    job = d.submit("turn", "acme", SPEC, placed[QWEN], priority="batch")
    assert d.send_job(d.jobs.get(job.id), shared=True) == d.routing.shared("batch", QWEN.pool)
    assert serves(d, "w-qwen", d.routing.shared("batch", QWEN.pool)) and not serves(d, "w-cpu", sent[-1][1])
    # idle workers (two tenants active): a job with no warm worker goes to an idle one's own queue, of its pool only
    # (a pool of one worker: its shared queue, the same to that worker)
    for worker in FLEET:
        d.routing.running(worker, {})
    d.routing.taken("w-cpu2", warm.id, "acme")  # the job sent to it by affinity, no longer on its way
    assert {d.routing.route(None, "interactive", CPU.pool, "acme", active=2) for _ in range(20)} == \
        {d.routing.own("w-cpu"), d.routing.own("w-cpu2")}
    for host in (GPU, QWEN):
        assert d.routing.route(None, "interactive", host.pool, "acme", active=2) == d.routing.shared("interactive", host.pool)


def test_a_model_or_numerics_nobody_hosts_is_refused(fleet: tuple[Dispatcher, Sent, Hosts]) -> None:
    d, sent, hosts = fleet
    with pytest.raises(ModelNotHosted) as e:
        hosts.choose("llama")
    assert e.value.code == "model_not_hosted" and "qwen-tiny (cpu/float32)" in e.value.message
    with pytest.raises(ModelNotHosted):
        hosts.choose("qwen-tiny", "cuda/bfloat16")
    with pytest.raises(ModelNotHosted):  # the same name and numerics, other weights
        hosts.require("small", "cpu/float32", "d" * 16)
    assert hosts.require("small", "cuda/bfloat16", GPU.fingerprint) == GPU
    hosts.gone("w-gpu")  # its last worker stopped (a restart): no job goes to it, its model stays known
    assert hosts.of("w-gpu") is None and hosts.require("small", "cuda/bfloat16", GPU.fingerprint) == GPU
    time.sleep(0.05)  # ... for host_grace_s: past it, its sessions' jobs are refused until one is back
    brief = Hosts(hosts.r, hosts.s.model_copy(update={"worker_heartbeat_s": 0.005, "host_grace_s": 0.02}))
    with pytest.raises(ModelNotHosted, match="in the last 0.02 s"):
        brief.require("small", "cuda/bfloat16", GPU.fingerprint)
    brief.beat("w-gpu", GPU)
    assert brief.require("small", "cuda/bfloat16") == GPU
    assert Host.parse(GPU.id) == GPU and GPU.pool == "small.cuda-bfloat16"
