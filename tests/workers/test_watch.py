"""workers/watch.py: one webhook sender pass, as its thread runs it: delivered to a real
receiver; a failing pass is logged.  The reaper's pass: tests/runtime/jobs/test_reaper.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from runtime.db import make_engine
from runtime.jobs.rows import Jobs
from runtime.settings import Settings
from runtime.webhooks.endpoints import Endpoints
from runtime.webhooks.sender import WebhookSender
from tests.receiver import receiver
from workers.watch import deliver_pass


def test_a_webhook_pass_delivers_prunes_and_survives_a_database_away(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    s = Settings(data_dir=tmp_path, webhook_allow_private=True)  # the receiver listens on 127.0.0.1
    engine = make_engine(s)
    jobs = Jobs(engine, s)
    with receiver() as rx:
        Endpoints(engine, allow_private=True).create("acme", rx.url)
        job, _ = jobs.create("agent", "acme", {})
        jobs.finish(job.id, jobs.claim(job.id, "w1").owner or "", "succeeded")
        sender = WebhookSender(engine, s, wait_s=math.inf)  # its pass counts what it sent (a worker's waits for none)
        assert deliver_pass(sender, prune=True) == {"delivered": 1, "retried": 0, "failed": 0, "deferred": 0,
                                                    "dropped": 0, "pruned": 0}
        assert [json.loads(g.body)["data"]["id"] for g in rx.got] == [job.id]

    def away(limit: int = 0, now: float | None = None) -> dict[str, int]:
        raise OperationalError("SELECT", {}, Exception("database is locked"))

    sender.deliver_due = away  # type: ignore[method-assign]
    assert deliver_pass(sender) == {}
    assert "webhook pass failed" in caplog.text
    sender.close()
