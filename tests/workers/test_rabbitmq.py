"""The worker suite's core cases with RabbitMQ as the broker (BROKER_URL amqp://), where the
machine runs one on 127.0.0.1:5672 (guest/guest); skipped, saying why, where it does not.  The KV
state stays in Redis.  A turn job completes token-identical to the engine in this process; a
worker killed (-9) mid-turn loses nothing (RabbitMQ requeues what its connection held) and the
job completes on another, token-identical, written once; with every slot busy, an interactive
job goes before a batch job queued earlier (the shared queue is a priority queue)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.jobs.routing import consumed_by, shared_queue
from tests.workers.conftest import make_cluster, reference
from tests.workers.test_faults import LONG, steps_seen, transcript
from tests.workers.test_queues import interactive_goes_first
from tests.workers.test_tasks import inputs
from workers.local import LocalCluster

AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def _rabbitmq_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _rabbitmq_up(), reason="no RabbitMQ on 127.0.0.1:5672 (the machine's own broker)")


def _delete_queues(c: LocalCluster, workers: list[str]) -> None:
    """RabbitMQ's queues outlive the cluster: the ones it declared go with it."""
    from kombu.connection import Connection

    with Connection(AMQP) as conn:  # type: ignore[no-untyped-call]
        ch = conn.channel()
        for q in {q for w in workers for q in consumed_by(c.settings, w)}:
            try:
                ch.queue_delete(q)
            except Exception:  # noqa: BLE001 - never declared
                ch = conn.channel()


@pytest.fixture(scope="module")
def rabbit(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = make_cluster(redis_url, tmp_path_factory.mktemp("rabbit"), broker_url=AMQP, batch_sessions=2)
    try:
        c.start("r1", "r2")
        c.ready("r1", "r2")
        yield c
    finally:
        c.close()
        _delete_queues(c, ["r1", "r2"])


def test_a_turn_job_completes_token_identical(rabbit: LocalCluster, loaded: tuple[SetDLM, Tokenizer]) -> None:
    c = rabbit
    assert shared_queue(c.settings, "interactive") == shared_queue(c.settings, "batch") == f"{c.settings.key_prefix}.shared"
    spec = inputs(loaded[1], 1)[0]
    sid = c.open("acme")
    done = c.wait(c.submit(sid, spec), 60)
    assert done.status == "succeeded", (done.error, c.log("r1"), c.log("r2"))
    assert [done.result["tokens"]] == reference(loaded, c, [spec])  # type: ignore[index]


def test_kill_9_mid_turn_completes_on_the_other_worker(rabbit: LocalCluster, loaded: tuple[SetDLM, Tokenizer]) -> None:
    c = rabbit
    specs = [inputs(loaded[1], 1)[0], LONG]
    sid = c.open("acme")
    first = c.wait(c.submit(sid, specs[0]), 60)
    c.dispatcher.routing.touch(sid, "r2")  # the session's last worker: its next turn goes there
    job = c.submit(sid, specs[1])
    assert job.queue == c.dispatcher.routing.own("r2")
    steps_seen(c, job, 20)
    c.kill("r2")
    done = c.wait(job, 90)
    assert done.status == "succeeded", (done.error, c.log("r1"))
    assert done.result is not None and done.result["worker"] == "r1"
    assert [first.result["tokens"], done.result["tokens"]] == reference(loaded, c, specs)  # type: ignore[index]
    assert [j for j, _ in transcript(c, sid)] == [first.id, job.id]  # none missing, none twice
    c.start("r2")  # the module's other tests have both workers
    c.ready("r2")


def test_with_every_slot_busy_an_interactive_job_goes_first(rabbit: LocalCluster) -> None:
    batch, inter = interactive_goes_first(rabbit, 4, timeout_s=90)  # 2 workers x 2 slots
    assert batch.queue == inter.queue == shared_queue(rabbit.settings, "batch")
