"""workers/celery_app.py: the settings a crash-safe, pickle-free worker needs, derived from
Settings; `setflow worker` refuses bad arguments with one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.cli import main
from runtime.settings import Settings
from workers.celery_app import broker_url, make_app
from workers.queue_order import InteractiveFirst


def test_app_is_json_only_late_acked_and_time_limited(tmp_path: Path) -> None:
    s = Settings(key_prefix="sfx", redis_url="redis://127.0.0.1:6379/0", task_soft_time_limit_s=100,
                 task_time_limit_s=120, visibility_timeout_s=600, data_dir=tmp_path)
    c = make_app(s).conf
    assert c.task_serializer == c.result_serializer == c.event_serializer == "json"
    assert list(c.accept_content) == ["json"] and "pickle" not in c.result_accept_content
    assert c.task_acks_late and c.task_reject_on_worker_lost and c.worker_prefetch_multiplier == 1
    assert (c.task_soft_time_limit, c.task_time_limit) == (100, 120)
    opts = c.broker_transport_options
    assert opts["visibility_timeout"] == 600 > c.task_time_limit
    assert opts["global_keyprefix"] == "sfx:celery:"
    assert opts["queue_order_strategy"] == "workers.queue_order:InteractiveFirst"
    assert c.task_default_queue == "sfx.interactive" and c.task_ignore_result


def test_broker_url(tmp_path: Path) -> None:
    assert broker_url(Settings(redis_url="redis://h:1/2")) == "redis://h:1/2"
    assert broker_url(Settings(redis_url="redis://h:1/2", broker_url="redis://b:3/4")) == "redis://b:3/4"
    embedded = broker_url(Settings(data_dir=tmp_path))  # no REDIS_URL: the embedded server's socket
    assert embedded == f"redis+socket://{tmp_path.resolve()}/redis/redis.sock"


def test_limits_must_nest() -> None:
    with pytest.raises(ValidationError, match="visibility_timeout_s"):
        Settings(task_time_limit_s=4000)  # the broker would hand a running task to a second worker
    with pytest.raises(ValidationError):
        Settings(task_soft_time_limit_s=700, task_time_limit_s=660)
    with pytest.raises(ValidationError):
        Settings(device="tpu")


def test_worker_cli_rejects_bad_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("SETFLOW_DATA_DIR", str(tmp_path))
    assert main(["worker", "--processes", "0"]) == 2
    assert capsys.readouterr().err.strip() == "setflow: error: --processes must be >= 1"


def test_own_and_interactive_queues_alternate_and_batch_comes_last() -> None:
    c = InteractiveFirst()
    c.update(["sf.w.w1", "sf.interactive", "sf.batch"])
    assert c.consume(3) == ["sf.w.w1", "sf.interactive", "sf.batch"]
    c.rotate("sf:celery:sf.w.w1")  # the transport names the queue with its key prefix
    assert c.consume(3) == ["sf.interactive", "sf.w.w1", "sf.batch"]
    c.rotate("sf:celery:sf.interactive")
    assert c.consume(3) == ["sf.w.w1", "sf.interactive", "sf.batch"]
    c.rotate("sf:celery:sf.batch")  # batch stays last
    assert c.consume(3)[-1] == "sf.batch"
