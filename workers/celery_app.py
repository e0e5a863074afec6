"""The Celery app, from Settings: JSON only, late acks, one message per process at a time.

- Serialisation: JSON for tasks, results and events; pickle is refused (accept_content).
- A message is acknowledged after its task returns (task_acks_late), and goes back to its queue
  when the worker process running it dies (task_reject_on_worker_lost); a process takes one
  message at a time (worker_prefetch_multiplier=1), so nothing waits behind a long turn.
- The broker's visibility timeout outlasts the hard time limit (Settings checks it), so a message
  whose task may still run is never handed to a second worker by the broker; a whole worker lost
  (kill -9) is noticed sooner, by the job's SQL lease and the reaper (workers/watch.py).
- Priorities are queues on Redis: a worker alternates between its own queue (warm sessions)
  and the shared interactive queue, and takes from batch only when both are empty
  (workers/queue_order.py).  On RabbitMQ (BROKER_URL amqp://) the shared queue is one priority
  queue (x-max-priority), and an interactive job's message outranks the batch ones waiting.
- No result backend: outcomes live in SQL (jobs), progress in a Redis stream per job.
"""

from __future__ import annotations

from celery import Celery
from kombu.entity import Exchange, Queue

from runtime.embedded import is_cluster
from runtime.jobs.dispatch import Send
from runtime.jobs.routing import AMQP_MAX_PRIORITY, AMQP_PRIORITY, is_amqp, shared_queue
from runtime.keys import Keys
from runtime.settings import Settings
from workers import broker

broker.install()  # the Redis transport that survives a broker restart on the thread pool (workers/broker.py)

TASK = "setflow.run_job"


def broker_url(settings: Settings) -> str:
    """BROKER_URL, else the KV Redis, else the embedded server's socket under data_dir.  A Redis
    Cluster cannot hold Celery's queues (kombu speaks to one server): it needs a BROKER_URL."""
    url = settings.broker_url or settings.redis_url
    if not settings.broker_url and url and is_cluster(url):
        raise ValueError(f"REDIS_URL {url} names a Redis Cluster, which cannot hold Celery's queues: "
                         "set BROKER_URL (a plain Redis server, or RabbitMQ)")
    if url is None:
        url = f"unix://{(settings.data_dir / 'redis' / 'redis.sock').resolve()}"
    if url.startswith("unix://"):  # kombu's spelling of a Redis unix socket
        url = "redis+socket://" + url.removeprefix("unix://")
    return url


def make_app(settings: Settings) -> Celery:
    app = Celery("setflow", broker=broker_url(settings), include=["workers.tasks"])
    shared = shared_queue(settings, "interactive")
    app.conf.update(
        task_serializer="json", result_serializer="json", event_serializer="json",
        accept_content=["json"], result_accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=settings.task_soft_time_limit_s,
        task_time_limit=settings.task_time_limit_s,
        task_default_queue=shared_queue(settings, "interactive"),
        task_create_missing_queues=True,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            "global_keyprefix": Keys(settings.key_prefix).broker,  # the broker's keys under our prefix
            "queue_order_strategy": "workers.queue_order:InteractiveFirst",
        },
        # RabbitMQ: the shared queue is declared as a priority queue, the same way by every
        # process (a queue declared twice with other arguments is refused)
        task_queues=[Queue(shared, Exchange(shared), routing_key=shared,  # type: ignore[no-untyped-call]
                           queue_arguments={"x-max-priority": AMQP_MAX_PRIORITY})] if is_amqp(settings) else None,
        # ... and so is every queue created on the way (a model's pool queues, a worker's own):
        # an interactive job outranks the batch ones in each
        task_queue_max_priority=AMQP_MAX_PRIORITY if is_amqp(settings) else None,
        broker_connection_retry_on_startup=True,
        worker_cancel_long_running_tasks_on_connection_loss=False,  # a turn survives a broker blip
        worker_hijack_root_logger=False,
        # a pool process builds its engine when forked (workers/tasks.py): loading torch and the
        # model (and CUDA) takes seconds, beyond Celery's 4 s default for a process to come up
        worker_proc_alive_timeout=120,
        worker_send_task_events=False,
    )
    return app


app = make_app(Settings())


def sender(celery: Celery) -> Send:
    """runtime/jobs/dispatch.Send over Celery: the task by name, the job id its only argument;
    on RabbitMQ the message carries its priority (the shared queue is a priority queue)."""
    amqp = celery.conf.broker_url.startswith(("amqp://", "amqps://", "pyamqp://"))

    def send(job_id: str, queue: str, priority: str = "interactive") -> None:
        celery.send_task(TASK, args=[job_id], queue=queue, priority=AMQP_PRIORITY[priority] if amqp else None)
    return send
