"""runtime/webhooks/outbox.py and sender.py on a real database (SQLite file; PostgreSQL where one answers) and a
real HTTP receiver on a loopback port: the transaction that ends a job writes its messages (and
one rolled back writes none), the sender signs them in the Standard Webhooks format (checked by
the standardwebhooks library and by the openai SDK's `webhooks.unwrap`), retries with backoff
under the same webhook-id, fails a message after webhook_retry_for_s, and a new sender
delivers what an old one left.  Time is driven by `now`: nothing sleeps through a backoff."""

from __future__ import annotations

import functools
import json
import math
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, select, update
from standardwebhooks import Webhook

from runtime.errors import BadInput, NotFound, OverBudget
from runtime.jobs.rows import Jobs
from runtime.settings import Settings
from runtime.tables import Base, WebhookEndpointRecord, WebhookMessageRecord
from runtime.webhooks import endpoints as webhook_endpoints
from runtime.webhooks import outbox as webhooks
from runtime.webhooks import sealed as webhook_secrets
from runtime.webhooks import transport as webhook_http
from runtime.webhooks.endpoints import Endpoints
from runtime.webhooks.outbox import event_type
from runtime.webhooks.sender import PER_ENDPOINT, WebhookSender, backoff, epoch
from tests.receiver import Received, closed_port_url, raw_receiver, receiver

S = Settings(webhook_retry_base_s=5.0, webhook_retry_max_s=3600.0, webhook_retry_for_s=26 * 3600.0,
             webhook_timeout_s=5.0, webhook_allow_private=True,  # the receivers listen on 127.0.0.1
             webhook_interval_s=60.0)  # a pass waits this long for its batches: here, for all of them


@pytest.fixture
def jobs(db_engine: Engine) -> Jobs:
    return Jobs(db_engine, S)


@pytest.fixture
def endpoints(db_engine: Engine) -> Endpoints:
    return Endpoints(db_engine, max_per_tenant=3, allow_private=True)


def _end(jobs: Jobs, kind: str = "narrative", status: str = "succeeded", result: dict[str, Any] | None = None,
         tenant: str = "acme") -> str:
    """A job that ran and ended with `status` (finish, under its claim)."""
    job, _ = jobs.create(kind, tenant, {"x": 1})
    owner = jobs.claim(job.id, "w1").owner
    assert owner is not None
    jobs.finish(job.id, owner, status, result=result)
    return job.id


def _messages(engine: Engine, endpoint_id: str | None = None) -> list[WebhookMessageRecord]:
    with engine.connect() as c:
        q = select(WebhookMessageRecord).order_by(WebhookMessageRecord.created_at)
        if endpoint_id is not None:
            q = q.where(WebhookMessageRecord.endpoint_id == endpoint_id)
        return list(c.execute(q).all())  # type: ignore[arg-type]


def _sender(engine: Engine, **kw: Any) -> WebhookSender:
    return WebhookSender(engine, S, rand=lambda: 0.0, wait_s=math.inf, **kw)  # no jitter: the backoff is exact; each pass counts all


def _verified(got: Received, secret: str) -> dict[str, Any]:
    """The body as both verifiers accept it (each raises on a bad signature)."""
    body: dict[str, Any] = Webhook(secret).verify(got.body, got.headers)
    client = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:1")
    unwrapped = client.webhooks.unwrap(got.body, got.headers, secret=secret)
    assert unwrapped.id == body["id"] and unwrapped.type == body["type"]
    return body


# ---- what an ending writes ---------------------------------------------------------------------


def test_event_types_of_endings() -> None:
    assert [event_type("response", s, None) for s in ("succeeded", "failed", "cancelled")] == [
        "response.completed", "response.failed", "response.cancelled"]
    assert event_type("response", "succeeded", {"status": "incomplete"}) == "response.incomplete"
    assert event_type("response", "succeeded", {"status": "completed"}) == "response.completed"
    assert [event_type("report", s, {"status": "incomplete"}) for s in ("succeeded", "failed", "cancelled")] == [
        "job.succeeded", "job.failed", "job.cancelled"]
    assert set(webhooks.EVENT_TYPES) == {event_type(k, s, r) for k in ("response", "agent")
                                         for s in ("succeeded", "failed", "cancelled")
                                         for r in (None, {"status": "incomplete"})} | {webhooks.READY}
    with pytest.raises(AssertionError):
        event_type("agent", "running", None)


def test_an_ending_writes_one_message_per_endpoint_that_takes_its_event(db_engine: Engine, jobs: Jobs,
                                                                       endpoints: Endpoints) -> None:
    every = endpoints.create("acme", "https://example.com/all")
    failures = endpoints.create("acme", "https://example.com/failures", ["job.failed"])
    endpoints.create("globex", "https://example.com/theirs")
    job_id = _end(jobs, "report", "succeeded", {"markdown": "..."})
    (m,) = _messages(db_engine)
    assert (m.endpoint_id, m.tenant, m.type, m.attempts, m.delivered_at, m.failed_at) == (
        every.id, "acme", "job.succeeded", 0, None, None)
    assert m.payload == {"id": m.id, "object": "event", "type": "job.succeeded", "created_at": m.payload["created_at"],
                         "data": {"id": job_id, "kind": "report", "status": "succeeded"}}
    assert m.id.startswith("msg_") and isinstance(m.payload["created_at"], int)
    assert abs(m.payload["created_at"] - time.time()) < 60
    failed = _end(jobs, "agent", "failed")
    assert {(x.endpoint_id, x.payload["data"]["id"]) for x in _messages(db_engine)} - {(every.id, job_id)} == {
        (every.id, failed), (failures.id, failed)}
    assert endpoints.deliveries("acme", failures.id) == {"pending": 1, "delivered": 0, "failed": 0}


def test_a_response_ending_is_a_response_event_on_its_public_id(db_engine: Engine, jobs: Jobs,
                                                                endpoints: Endpoints) -> None:
    endpoints.create("acme", "https://example.com/hooks")
    done = _end(jobs, "response", "succeeded", {"status": "completed"})
    cut = _end(jobs, "response", "succeeded", {"status": "incomplete"})
    failed = _end(jobs, "response", "failed")
    got = {m.payload["data"]["id"]: (m.type, m.payload["data"]) for m in _messages(db_engine)}
    assert got == {f"resp_{done}": ("response.completed", {"id": f"resp_{done}"}),
                   f"resp_{cut}": ("response.incomplete", {"id": f"resp_{cut}"}),
                   f"resp_{failed}": ("response.failed", {"id": f"resp_{failed}"})}


def test_every_way_a_job_ends_writes_its_message(db_engine: Engine, endpoints: Endpoints) -> None:
    """cancel (queued, waiting for tool outputs), expire_waits, _give_up (attempts spent): each
    in the transaction that ends the job; a cancel of a running job ends nothing yet."""
    jobs = Jobs(db_engine, S.model_copy(update={"job_max_attempts": 1, "job_lease_s": 0.001}))
    endpoints.create("acme", "https://example.com/hooks")
    queued, _ = jobs.create("agent", "acme", {})
    jobs.cancel(queued.id, "acme")
    waiting, _ = jobs.create("response", "acme", {})
    jobs.suspend(waiting.id, jobs.claim(waiting.id, "w1").owner or "", [{"id": "c1"}], wait_s=3600)
    jobs.cancel(waiting.id, "acme")
    late, _ = jobs.create("agent", "acme", {})
    jobs.suspend(late.id, jobs.claim(late.id, "w1").owner or "", [{"id": "c1"}], wait_s=0.001)
    running, _ = jobs.create("agent", "acme", {})
    jobs.claim(running.id, "w1")
    time.sleep(0.01)  # past `late`'s wait and `running`'s lease
    assert [j.id for j in jobs.expire_waits()] == [late.id]
    assert not jobs.requeue(jobs.get(running.id)) and jobs.get(running.id).status == "failed"  # gave up
    stopping, _ = jobs.create("agent", "acme", {})
    jobs.claim(stopping.id, "w1")
    assert jobs.cancel(stopping.id, "acme")[1] is False  # marked: its holder ends it (finish)
    got = sorted((m.payload["data"]["id"], m.type) for m in _messages(db_engine))
    assert got == sorted([(queued.id, "job.cancelled"), (f"resp_{waiting.id}", "response.cancelled"),
                          (late.id, "job.failed"), (running.id, "job.failed")])


def test_an_ending_rolled_back_or_refused_writes_no_message(db_engine: Engine, jobs: Jobs, endpoints: Endpoints,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    endpoints.create("acme", "https://example.com/hooks")
    job, _ = jobs.create("agent", "acme", {})
    owner = jobs.claim(job.id, "w1").owner or ""
    real = webhooks.enqueue

    def then_fail(db: Any, job_id: str) -> int:
        assert real(db, job_id) == 1  # written, inside the ending's transaction
        raise RuntimeError("the database went away before the commit")

    monkeypatch.setattr(webhooks, "enqueue", then_fail)
    with pytest.raises(RuntimeError):
        jobs.finish(job.id, owner, "succeeded")
    assert jobs.get(job.id).status == "running" and _messages(db_engine) == []
    monkeypatch.setattr(webhooks, "enqueue", real)
    with pytest.raises(Exception, match="claim_lost"):  # not the holder: nothing ends, nothing is written
        jobs.finish(job.id, "not-the-owner", "succeeded")
    assert _messages(db_engine) == []
    jobs.finish(job.id, owner, "succeeded")
    assert len(_messages(db_engine)) == 1


# ---- delivery -----------------------------------------------------------------------------------


def test_a_response_completed_is_delivered_signed_and_verifies_with_both_libraries(
        db_engine: Engine, jobs: Jobs, endpoints: Endpoints) -> None:
    with receiver() as rx:
        ep = endpoints.create("acme", rx.url, ["response.completed"])
        job_id = _end(jobs, "response", "succeeded", {"status": "completed"})
        sender = _sender(db_engine)
        assert sender.deliver_due() == {"delivered": 1, "retried": 0, "failed": 0, "deferred": 0, "dropped": 0}
        assert sender.deliver_due()["delivered"] == 0, "delivered once"
        sender.close()
    (got,) = rx.got
    assert got.path == "/hooks" and got.headers["content-type"] == "application/json"
    (m,) = _messages(db_engine)
    assert got.headers["webhook-id"] == m.id and abs(int(got.headers["webhook-timestamp"]) - time.time()) < 60
    assert got.headers["webhook-signature"].startswith("v1,")
    body = _verified(got, ep.secret)
    assert body == {"id": m.id, "object": "event", "type": "response.completed", "created_at": m.payload["created_at"],
                    "data": {"id": f"resp_{job_id}"}}
    unwrapped = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:1").webhooks.unwrap(
        got.body, got.headers, secret=ep.secret)
    assert unwrapped.type == "response.completed" and unwrapped.data.id == f"resp_{job_id}"
    with pytest.raises(Exception, match="signature"):  # another endpoint's secret does not verify it
        Webhook(webhook_endpoints.new_secret()).verify(got.body, got.headers)
    assert m.delivered_at is not None and m.attempts == 1
    assert endpoints.deliveries("acme", ep.id) == {"pending": 0, "delivered": 1, "failed": 0}


def test_a_failing_receiver_is_retried_with_backoff_under_one_webhook_id(db_engine: Engine, jobs: Jobs,
                                                                         endpoints: Endpoints) -> None:
    with receiver(500, 503) as rx:
        ep = endpoints.create("acme", rx.url)
        _end(jobs)
        sender, t0 = _sender(db_engine), time.time() + 1
        assert sender.deliver_due(now=t0)["retried"] == 1
        (m,) = _messages(db_engine)
        assert (m.attempts, m.next_attempt_at, m.last_error) == (1, t0 + 5.0, "HTTP 500")  # base 5 s
        assert sender.deliver_due(now=t0 + 4.9)["retried"] == 0 and len(rx.got) == 1, "not due before its backoff"
        assert sender.deliver_due(now=t0 + 5.0)["retried"] == 1
        (m,) = _messages(db_engine)
        assert (m.attempts, m.next_attempt_at, m.last_error) == (2, t0 + 5.0 + 10.0, "HTTP 503")  # doubled
        assert sender.deliver_due(now=t0 + 15.0)["delivered"] == 1
        sender.close()
    assert len(rx.got) == 3 and len({g.headers["webhook-id"] for g in rx.got}) == 1, "one id on every attempt"
    assert {json.dumps(_verified(g, ep.secret), sort_keys=True) for g in rx.got} == {
        json.dumps(m.payload, sort_keys=True)}, "the same event each time, each signature valid"
    (m,) = _messages(db_engine)
    assert m.attempts == 3 and m.delivered_at is not None and m.last_error == ""


def test_backoff_doubles_from_its_base_up_to_its_cap_with_jitter_below() -> None:
    assert [backoff(n, 5.0, 3600.0, 0.0) for n in range(1, 13)] == [
        5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, 3600]
    assert backoff(1000, 5.0, 3600.0, 0.0) == 3600
    assert 0.75 * 40 < backoff(4, 5.0, 3600.0, 0.999) < 40


def test_an_unreachable_receiver_fails_its_messages_after_the_retry_period(db_engine: Engine, jobs: Jobs,
                                                                           endpoints: Endpoints) -> None:
    ep = endpoints.create("acme", closed_port_url())
    first, second = _end(jobs), _end(jobs)
    sender, t0 = _sender(db_engine), time.time() + 1
    # the first refusal costs the pass its endpoint: the other message waits as long, unattempted
    assert sender.deliver_due(now=t0) == {"delivered": 0, "retried": 1, "failed": 0, "deferred": 1, "dropped": 0}
    ms = _messages(db_engine)
    assert sorted(m.attempts for m in ms) == [0, 1] and {m.next_attempt_at for m in ms} == {t0 + 5.0}
    assert "ConnectError" in max(ms, key=lambda m: m.attempts).last_error
    end = t0 + S.webhook_retry_for_s + 60
    sender.deliver_due(now=end)  # the first attempt past the period fails it
    sender.deliver_due(now=end)
    sender.close()
    assert {m.payload["data"]["id"]: m.failed_at is not None for m in _messages(db_engine)} == {first: True, second: True}
    assert endpoints.deliveries("acme", ep.id) == {"pending": 0, "delivered": 0, "failed": 2}
    assert _sender(db_engine).deliver_due(now=end + 10**6)["retried"] == 0, "a failed message is never sent again"


def test_the_last_retry_comes_at_the_deadline_not_after_it(db_engine: Engine, jobs: Jobs, endpoints: Endpoints) -> None:
    endpoints.create("acme", closed_port_url())
    _end(jobs)
    (m,) = _messages(db_engine)
    created = epoch(m.created_at)
    near = created + S.webhook_retry_for_s - 100  # a backoff of an hour would pass the deadline
    with db_engine.begin() as c:
        c.execute(update(WebhookMessageRecord).values(attempts=20))
    sender = _sender(db_engine)
    assert sender.deliver_due(now=near)["retried"] == 1
    (m,) = _messages(db_engine)
    assert m.next_attempt_at == pytest.approx(created + S.webhook_retry_for_s)
    assert sender.deliver_due(now=m.next_attempt_at)["failed"] == 1
    sender.close()


class Crash(BaseException):
    """The worker process dies in the middle of a request."""


def test_a_new_sender_delivers_what_a_dead_one_left(db_engine: Engine, jobs: Jobs, endpoints: Endpoints) -> None:
    with receiver() as rx:
        ep = endpoints.create("acme", rx.url)
        _end(jobs)

        def die(request: httpx.Request) -> httpx.Response:
            raise Crash

        t0 = time.time() + 1
        dead = _sender(db_engine, http=httpx.Client(transport=httpx.MockTransport(die)))
        with pytest.raises(Crash):
            dead.deliver_due(now=t0)  # claimed, never recorded
        (m,) = _messages(db_engine)
        assert m.attempts == 0 and m.delivered_at is None and m.next_attempt_at > t0
        restarted = _sender(db_engine)  # another worker, or this one after its restart
        assert restarted.deliver_due(now=t0)["delivered"] == 0, "the dead sender's claim holds until its lease ends"
        assert rx.got == []
        assert restarted.deliver_due(now=m.next_attempt_at)["delivered"] == 1
        restarted.close()
    (got,) = rx.got
    assert _verified(got, ep.secret)["id"] == m.id


def test_a_restarted_sender_resumes_the_retries(db_engine: Engine, jobs: Jobs, endpoints: Endpoints) -> None:
    with receiver(500) as rx:
        endpoints.create("acme", rx.url)
        _end(jobs)
        t0 = time.time() + 1
        first = _sender(db_engine)
        assert first.deliver_due(now=t0)["retried"] == 1
        first.close()
        second = _sender(db_engine)
        assert second.deliver_due(now=t0 + 5.0)["delivered"] == 1
        second.close()
    assert [g.headers["webhook-id"] for g in rx.got] == [_messages(db_engine)[0].id] * 2


# ---- endpoints, the outbox's retention, the schema ------------------------------------------------


def test_endpoints_are_checked_capped_and_per_tenant(db_engine: Engine, endpoints: Endpoints) -> None:
    for bad in ("ftp://example.com/x", "example.com/hooks", "https://", "http://x/" + "a" * 2048, ""):
        with pytest.raises(BadInput, match="url"):
            endpoints.create("acme", bad)
    with pytest.raises(BadInput, match="unknown event types"):
        endpoints.create("acme", "https://example.com", ["job.succeeded", "response.created"])
    assert endpoints.listing("acme") == []
    made = [endpoints.create("acme", f"https://example.com/{i}", ["job.failed", "job.failed"]) for i in range(3)]
    assert made[0].events == ["job.failed"] and made[0].secret.startswith("whsec_") and len(made[0].secret) == 38
    assert len({m.secret for m in made}) == 3
    with pytest.raises(OverBudget, match="tenant_max_webhooks"):
        endpoints.create("acme", "https://example.com/4")
    assert [e.id for e in endpoints.listing("acme")] == [m.id for m in made]
    with pytest.raises(NotFound):
        endpoints.get("globex", made[0].id)
    with pytest.raises(NotFound):
        endpoints.delete("globex", made[0].id)
    with pytest.raises(NotFound):
        endpoints.get("acme", "../etc")
    endpoints.create("globex", "https://example.com/theirs")  # their own cap


def test_delete_drops_the_pending_messages_and_the_sender_drops_a_late_one(db_engine: Engine, jobs: Jobs,
                                                                          endpoints: Endpoints) -> None:
    ep = endpoints.create("acme", closed_port_url())
    _end(jobs), _end(jobs)
    assert endpoints.delete("acme", ep.id) == 2 and _messages(db_engine) == []
    with pytest.raises(NotFound):
        endpoints.deliveries("acme", ep.id)
    ep = endpoints.create("acme", closed_port_url())
    _end(jobs)
    with db_engine.begin() as c:  # deleted while the ending's transaction read it: its message is an orphan
        c.execute(WebhookMessageRecord.__table__.update().values(endpoint_id="we_" + "0" * 24))
    sender = _sender(db_engine)
    assert sender.deliver_due()["dropped"] == 1 and _messages(db_engine) == []
    sender.close()


def test_prune_deletes_finished_messages_past_the_retention(db_engine: Engine, jobs: Jobs,
                                                            endpoints: Endpoints) -> None:
    with receiver() as rx:
        endpoints.create("acme", rx.url)
        _end(jobs)
        sender = _sender(db_engine)
        sender.deliver_due()
    endpoints.create("acme", closed_port_url())
    _end(jobs)  # one delivered (to the first), two pending (one each)
    later = time.time() + S.job_retention_s + 60
    assert sender.prune() == 0, "within the retention"
    assert sender.prune(now=later) == 1
    assert len(_messages(db_engine)) == 2 and all(m.delivered_at is None for m in _messages(db_engine))
    sender.close()


def test_the_migration_builds_the_tables_as_declared(db_engine: Engine) -> None:
    with db_engine.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c), Base.metadata)
    ours = [d for d in diff if "webhook" in repr(d)]
    assert ours == []


def test_a_name_that_resolves_to_a_private_address_is_not_delivered_to(db_engine: Engine, jobs: Jobs) -> None:
    """The default sender (webhook_allow_private off) resolves each host itself and connects only
    to public addresses: a receiver reached by a name that resolves to 127.0.0.1 gets nothing
    (the attempt fails saying why, and is retried as any failure), though the name passed the
    check at creation; with webhook_allow_private the same endpoint is delivered to."""
    with receiver() as rx:
        named = rx.url.replace("127.0.0.1", "localhost")  # a name: what it resolves to is checked when sent
        ep = Endpoints(db_engine, allow_private=True).create("acme", named)
        _end(jobs, "response", "succeeded", {"status": "completed"})
        guarded = WebhookSender(db_engine, S.model_copy(update={"webhook_allow_private": False}), rand=lambda: 0.0, wait_s=math.inf)
        assert guarded.deliver_due()["retried"] == 1 and rx.got == []
        guarded.close()
        (m,) = _messages(db_engine)
        assert "not a public address" in (m.last_error or ""), m.last_error
        sender = _sender(db_engine)
        assert sender.deliver_due(now=time.time() + 3600)["delivered"] == 1 and len(rx.got) == 1
        sender.close()
    assert Endpoints(db_engine).deliveries("acme", ep.id)["delivered"] == 1



@pytest.mark.parametrize(("url", "ok"), [("https://example.com/h", True), ("http://8.8.8.8/h", True),
                                         ("http://127.0.0.1/h", False), ("http://[::ffff:127.0.0.1]/h", False),
                                         ("http://192.168.1.2/h", False), ("http://LOCALHOST./h", False),
                                         ("http://[fe80::1]/h", False), ("http://224.0.0.1/h", False),
                                         # the short and numeric forms of 127.0.0.1 a resolver reads (they were taken)
                                         ("http://127.1/h", False), ("http://2130706433/h", False),
                                         ("http://0x7f000001/h", False), ("http://1.1/h", True)])
def test_check_url_refuses_non_public_hosts(url: str, ok: bool) -> None:
    try:
        webhook_endpoints.check_url(url)
        assert ok, url
    except BadInput:
        assert not ok, url
    assert webhook_endpoints.check_url(url, allow_private=True) == url


def test_a_url_with_a_port_out_of_range_is_refused_and_a_password_is_never_listed() -> None:
    with pytest.raises(BadInput, match="port is 1..65535"):
        webhook_endpoints.check_url("http://example.com:99999/h")
    assert webhook_endpoints.shown("https://bob:s3cret@example.com/h?x=1") == "https://bob:***@example.com/h?x=1"
    assert webhook_endpoints.shown("https://example.com/h") == "https://example.com/h"


# ---- what a receiver may cost: a deadline per delivery, a capped head, fair passes ----------------

PROCESSING = b"HTTP/1.1 102 Processing\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
FAST = S.model_copy(update={"webhook_timeout_s": 1.0})  # a delivery's deadline, against receivers holding 30 s


def _error(engine: Engine, endpoint_id: str) -> str:
    (m,) = _messages(engine, endpoint_id)
    return m.last_error or ""


def test_a_receiver_answering_102_forever_fails_by_the_deadline_and_another_endpoint_is_delivered(
        db_engine: Engine, jobs: Jobs, endpoints: Endpoints) -> None:
    """The audit's receiver: `102 Processing` every 0.2 s for 30 s (httpx's per-read timeout never
    fires, and httpcore reads past every interim answer): the attempt fails within the deadline
    (1 s here), is retried as any failure, and another endpoint's message of the same pass is
    delivered."""
    with raw_receiver(lambda: [*[PROCESSING] * 150, OK], every_s=0.2) as slow, receiver() as rx:
        stuck = endpoints.create("acme", slow.url)
        fine = endpoints.create("globex", rx.url)
        _end(jobs, tenant="acme"), _end(jobs, tenant="globex")
        sender, t0 = WebhookSender(db_engine, FAST, rand=lambda: 0.0, wait_s=math.inf), time.monotonic()
        got = sender.deliver_due()
        took = time.monotonic() - t0
        sender.close()
    assert took < 10, f"the pass took {took:.1f} s: it waited for the receiver"
    assert (got["delivered"], got["retried"]) == (1, 1) and len(rx.got) == 1
    assert _messages(db_engine, fine.id)[0].delivered_at is not None
    assert "deadline" in _error(db_engine, stuck.id) or "interim" in _error(db_engine, stuck.id)


def test_a_receiver_dripping_its_headers_fails_by_the_deadline(db_engine: Engine, jobs: Jobs,
                                                                 endpoints: Endpoints) -> None:
    """No interim answer, a header line every 0.2 s (each read comes well within any timeout):
    only a deadline on the whole request ends it."""
    lines = [b"HTTP/1.1 200 OK\r\n", *[b"x-wait: 1\r\n"] * 150, b"content-length: 0\r\n\r\n"]
    with raw_receiver(lambda: lines, every_s=0.2) as slow:
        ep = endpoints.create("acme", slow.url)
        _end(jobs)
        sender, t0 = WebhookSender(db_engine, FAST, rand=lambda: 0.0, wait_s=math.inf), time.monotonic()
        assert sender.deliver_due()["retried"] == 1
        took = time.monotonic() - t0
        sender.close()
    assert took < 10 and "deadline" in _error(db_engine, ep.id), (took, _error(db_engine, ep.id))


def test_too_many_interim_answers_or_too_long_a_head_fail_the_attempt(db_engine: Engine, jobs: Jobs,
                                                                       endpoints: Endpoints) -> None:
    """Within the deadline (30 s here), a receiver that sends 50 interim answers at once, or a
    head of 12 KB (h11 itself takes up to 16 KB), has its attempt failed and retried; one
    interim answer before a 200 is a delivery, and so is a 200 whose 20 KB body comes with its
    head (a body is not the head: never read)."""
    slow = S.model_copy(update={"webhook_timeout_s": 30.0})
    pad = b"".join(b"x-pad-%d: %s\r\n" % (i, b"a" * 100) for i in range(110))
    cases = [([PROCESSING] * 50 + [OK], "interim"), ([b"HTTP/1.1 200 OK\r\n" + pad + b"content-length: 0\r\n\r\n"], "head"),
             ([PROCESSING, OK], None), ([b"HTTP/1.1 200 OK\r\ncontent-length: 20000\r\n\r\n" + b"x" * 20000], None)]
    for chunks, why in cases:
        with raw_receiver(functools.partial(list, chunks)) as rx:
            ep = endpoints.create("acme", rx.url)
            _end(jobs)
            sender = WebhookSender(db_engine, slow, rand=lambda: 0.0, wait_s=math.inf)
            got = sender.deliver_due()
            sender.close()
        if why is None:
            assert got["delivered"] == 1, _error(db_engine, ep.id)
        else:
            assert got["retried"] == 1 and why in _error(db_engine, ep.id), _error(db_engine, ep.id)
        endpoints.delete("acme", ep.id)


def test_a_pass_takes_the_tenants_in_turn_and_caps_an_endpoint(db_engine: Engine, jobs: Jobs,
                                                               endpoints: Endpoints) -> None:
    """A tenant with many messages due does not fill a pass: another tenant's one message, newer
    than all of them, is in the first pass; one endpoint gets at most PER_ENDPOINT a pass."""
    with receiver() as rx:
        busy = endpoints.create("acme", rx.url)
        for _ in range(PER_ENDPOINT + 5):
            _end(jobs, tenant="acme")
        other = endpoints.create("globex", rx.url)
        _end(jobs, tenant="globex")
        sender = _sender(db_engine)
        assert sender.deliver_due(limit=3)["delivered"] == 3
        assert _messages(db_engine, other.id)[0].delivered_at is not None, "its turn came in the first pass"
        assert sender.deliver_due()["delivered"] == PER_ENDPOINT  # of the 13 left
        assert sender.deliver_due()["delivered"] == 3
        sender.close()
    assert endpoints.deliveries("acme", busy.id) == {"pending": 0, "delivered": PER_ENDPOINT + 5, "failed": 0}


def test_a_tenants_slow_endpoints_take_its_share_of_a_pass_not_the_pass(db_engine: Engine, jobs: Jobs) -> None:
    """Ten endpoints of one tenant hold every request to their deadline (2 s): another tenant's
    message of the same pass reaches its receiver at once (a free slot: at most PER_TENANT of
    a tenant's run together), and the pass ends within its own time plus one deadline."""
    many = Endpoints(db_engine, max_per_tenant=10, allow_private=True)
    settings = S.model_copy(update={"webhook_timeout_s": 2.0})
    with raw_receiver(lambda: [PROCESSING] * 150, every_s=0.2) as slow, receiver() as rx:
        for _ in range(10):
            many.create("acme", slow.url)
        _end(jobs, tenant="acme")
        many.create("globex", rx.url)
        _end(jobs, tenant="globex")
        arrived: list[float] = []
        sender, t0 = WebhookSender(db_engine, settings, rand=lambda: 0.0, wait_s=math.inf), time.monotonic()
        real = sender._send

        def timed(endpoint: Any, m: Any) -> str | None:
            error = real(endpoint, m)
            if endpoint.tenant == "globex":
                arrived.append(time.monotonic() - t0)
            return error

        sender._send = timed  # type: ignore[method-assign]
        got = sender.deliver_due()
        took = time.monotonic() - t0
        sender.close()
    assert got["delivered"] == 1 and len(rx.got) == 1 and arrived and arrived[0] < 1.5, (got, arrived)
    assert slow.connections <= 10 and took < 2 * settings.webhook_timeout_s + 3, took


# ---- the SSRF guard, whatever the environment and however an address is written -----------------

#: IPv6 addresses that carry an IPv4 one, judged by it: a NAT64 gateway, a 6to4 or Teredo relay,
#: a stack that routes IPv4-compatible or mapped addresses delivers to the IPv4 address
EMBEDDED = [("64:ff9b::7f00:1", False), ("64:ff9b::a00:5", False), ("64:ff9b::808:808", True),  # NAT64
            ("64:ff9b:1::808:808", False),  # local-use NAT64: where its IPv4 sits is the operator's choice
            ("2002:7f00:1::", False), ("2002:a9fe:a9fe::1", False), ("2002:808:808::1", True),  # 6to4
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", False),  # Teredo, client 127.0.0.1 (stored inverted)
            ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", True),  # Teredo, client 8.8.8.8
            ("::127.0.0.1", False), ("::10.0.0.5", False), ("::8.8.8.8", True),  # IPv4-compatible
            ("::ffff:169.254.169.254", False), ("::ffff:8.8.8.8", True)]  # IPv4-mapped


@pytest.mark.parametrize(("address", "ok"), EMBEDDED)
def test_an_ipv6_address_that_embeds_an_ipv4_one_is_judged_by_it(address: str, ok: bool) -> None:
    assert webhook_http.public(address) is ok
    url = f"http://[{address}]/h"
    if ok:
        assert webhook_endpoints.check_url(url) == url
    else:
        with pytest.raises(BadInput, match="public addresses only"):
            webhook_endpoints.check_url(url)


def test_a_name_that_resolves_to_a_nat64_address_of_a_private_one_is_not_connected_to(
        db_engine: Engine, jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> None:
    """At delivery, every address a name resolves to is judged as at creation (an embedded
    IPv4 address included): the attempt fails saying why, before any connect."""
    real = socket.getaddrinfo

    def resolve(host: str, port: Any, *args: Any, **kw: Any) -> Any:
        if host == "hooks.example.com":
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("64:ff9b::a9fe:a9fe", port, 0, 0))]
        return real(host, port, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    ep = Endpoints(db_engine).create("acme", "http://hooks.example.com/h")
    _end(jobs)
    sender = WebhookSender(db_engine, S.model_copy(update={"webhook_allow_private": False}), rand=lambda: 0.0, wait_s=math.inf)
    assert sender.deliver_due()["retried"] == 1
    sender.close()
    assert "64:ff9b::a9fe:a9fe: not a public address" in _error(db_engine, ep.id), _error(db_engine, ep.id)


def test_a_proxy_in_the_workers_environment_is_not_used(db_engine: Engine, jobs: Jobs,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP(S)_PROXY or ALL_PROXY in a worker's environment would send each delivery to the proxy
    (a host nobody checked, that reaches the URL's host unchecked): the sender takes none."""
    with receiver() as proxy:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
            monkeypatch.setenv(name, proxy.url.removesuffix("/hooks"))
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        ep = Endpoints(db_engine).create("acme", "http://webhooks.invalid/h")  # resolves nowhere
        _end(jobs)
        sender = WebhookSender(db_engine, S.model_copy(update={"webhook_allow_private": False}), rand=lambda: 0.0, wait_s=math.inf)
        assert sender.deliver_due()["retried"] == 1
        sender.close()
    assert proxy.got == [], "sent through the proxy"
    assert "webhooks.invalid" in _error(db_engine, ep.id), _error(db_engine, ep.id)


# ---- secrets at rest ----------------------------------------------------------------------------

KEY = "k" * 32  # a deployment's secret_key (SETFLOW_SECRET_KEY)


def _stored_secret(engine: Engine, endpoint_id: str) -> str:
    with engine.connect() as c:
        return str(c.scalar(select(WebhookEndpointRecord.secret).where(WebhookEndpointRecord.id == endpoint_id)))


def test_a_secret_is_kept_sealed_and_signs_only_under_its_key(db_engine: Engine, jobs: Jobs) -> None:
    """Under a secret_key the row keeps the secret sealed (a copy of the database cannot sign);
    the sender opens it to sign; without the key, or under another, the attempt fails saying
    so; a sealed secret copied to another endpoint's row opens nowhere."""
    with receiver() as rx:
        ep = Endpoints(db_engine, allow_private=True, secret_key=KEY).create("acme", rx.url)
        assert ep.secret.startswith("whsec_"), "the creator gets it in the clear"
        stored = _stored_secret(db_engine, ep.id)
        assert stored.startswith("sealed1:") and len(stored) <= 64
        assert ep.secret.removeprefix("whsec_") not in stored
        _end(jobs, "response", "succeeded", {"status": "completed"})
        t0 = time.time()
        for hours, wrong in enumerate((None, "another key, 16+ chars"), 1):
            sender = WebhookSender(db_engine, S.model_copy(update={"secret_key": wrong}), rand=lambda: 0.0, wait_s=math.inf)
            assert sender.deliver_due(now=t0 + 3600 * hours)["retried"] == 1
            sender.close()
            assert _error(db_engine, ep.id).startswith("Unsealable"), _error(db_engine, ep.id)
        sender = WebhookSender(db_engine, S.model_copy(update={"secret_key": KEY}), rand=lambda: 0.0, wait_s=math.inf)
        assert sender.deliver_due(now=t0 + 3 * 3600)["delivered"] == 1
        sender.close()
    assert len(rx.got) == 1 and _verified(rx.got[0], ep.secret)["type"] == "response.completed"
    other = Endpoints(db_engine, secret_key=KEY).create("acme", "https://example.com/other")
    with pytest.raises(webhook_secrets.Unsealable):
        webhook_secrets.unseal(stored, "acme", other.id, webhook_secrets.key_of(KEY))
    with pytest.raises(webhook_secrets.Unsealable):
        webhook_secrets.unseal(stored, "globex", ep.id, webhook_secrets.key_of(KEY))


def test_a_secret_kept_in_the_clear_still_signs_and_is_sealed_once_a_key_is_set(db_engine: Engine,
                                                                                 jobs: Jobs) -> None:
    with receiver() as rx:
        ep = Endpoints(db_engine, allow_private=True).create("acme", rx.url)  # before secret_key was set
        assert _stored_secret(db_engine, ep.id) == ep.secret
        _end(jobs)
        sender = WebhookSender(db_engine, S.model_copy(update={"secret_key": KEY}), rand=lambda: 0.0, wait_s=math.inf)
        assert sender.deliver_due()["delivered"] == 1, "read as it is"
        sender.prune()  # seals what is still in the clear
        assert _stored_secret(db_engine, ep.id).startswith("sealed1:")
        assert sender.seal_clear() == 0
        _end(jobs)
        assert sender.deliver_due()["delivered"] == 1
        sender.close()
    assert [_verified(g, ep.secret)["type"] for g in rx.got] == ["job.succeeded"] * 2


def test_a_name_whose_dns_does_not_answer_fails_by_the_deadline(db_engine: Engine, jobs: Jobs,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """getaddrinfo has no timeout of its own: a lookup that hangs ends the attempt at the
    deadline (1 s here), and another endpoint's lookup is not held up behind it."""
    released, real = threading.Event(), socket.getaddrinfo

    def resolve(host: str, port: Any, *args: Any, **kw: Any) -> Any:
        if host == "slow.example.com":
            released.wait(30)
        return real(host, port, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with receiver() as rx:
        hung = Endpoints(db_engine, allow_private=True).create("acme", "http://slow.example.com/h")
        Endpoints(db_engine, allow_private=True).create("globex", rx.url.replace("127.0.0.1", "localhost"))
        _end(jobs, tenant="acme"), _end(jobs, tenant="globex")
        sender, t0 = WebhookSender(db_engine, FAST, rand=lambda: 0.0, wait_s=math.inf), time.monotonic()
        got = sender.deliver_due()
        took = time.monotonic() - t0
        sender.close()
        released.set()
    assert (got["delivered"], got["retried"]) == (1, 1) and len(rx.got) == 1, got
    assert took < 10 and "no address within" in _error(db_engine, hung.id), (took, _error(db_engine, hung.id))


def test_a_pass_does_not_wait_for_a_slow_receiver(db_engine: Engine, jobs: Jobs, endpoints: Endpoints) -> None:
    """A pass (the workers': it waits for nothing) returns while a receiver holds its delivery
    (to the deadline, 5 s here): the next pass, waiting for its own batches only, delivers
    another tenant's message, written meanwhile, at once, and leaves the endpoint in flight
    alone; a later pass counts the slow one's failure."""
    settings = S.model_copy(update={"webhook_timeout_s": 5.0})
    dripping = [b"HTTP/1.1 200 OK\r\n", *[b"x-wait: 1\r\n"] * 150, b"content-length: 0\r\n\r\n"]
    with raw_receiver(lambda: dripping, every_s=0.2) as slow, receiver() as rx:
        stuck = endpoints.create("acme", slow.url)
        _end(jobs, tenant="acme")
        sender, t0 = WebhookSender(db_engine, settings, rand=lambda: 0.0), time.monotonic()
        assert sender.deliver_due() == {"delivered": 0, "retried": 0, "failed": 0, "deferred": 0,
                                                  "dropped": 0}
        assert time.monotonic() - t0 < 4, "the pass waited for the receiver"
        endpoints.create("globex", rx.url)
        _end(jobs, tenant="acme"), _end(jobs, tenant="globex")  # acme's second waits for its endpoint's first
        sender.wait_s = 2.0  # for the batches this pass starts
        second = sender.deliver_due()
        in_flight = time.monotonic() - t0 < settings.webhook_timeout_s
        assert second["delivered"] == 1 and len(rx.got) == 1 and (second["retried"] == 0 or not in_flight), second
        deadline = time.monotonic() + 30  # the first delivery's connection, accepted by the receiver's thread
        while slow.connections < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert slow.connections == 1, "one delivery at a time to an endpoint"
        sender.wait_s = math.inf
        assert sender.deliver_due()["retried"] + second["retried"] == 1
        sender.close()
    assert any("deadline" in (m.last_error or "") for m in _messages(db_engine, stuck.id))


def test_a_name_with_several_addresses_is_connected_to_the_next_where_one_refuses(
        db_engine: Engine, jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> None:
    """As socket.create_connection does (a dual-stack name whose ::1 refuses): every address is
    checked, then tried in order; nothing is looked up again between the check and the connect."""
    real, looked = socket.getaddrinfo, []

    def resolve(host: str, port: Any, *args: Any, **kw: Any) -> Any:
        if host == "two.example.com":
            looked.append(host)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in ("127.0.0.2", "127.0.0.1")]
        return real(host, port, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with receiver() as rx:  # it listens on 127.0.0.1 only: 127.0.0.2 refuses
        Endpoints(db_engine, allow_private=True).create("acme", rx.url.replace("127.0.0.1", "two.example.com"))
        _end(jobs)
        sender = _sender(db_engine)
        assert sender.deliver_due()["delivered"] == 1 and len(rx.got) == 1
        sender.close()
    assert looked == ["two.example.com"]


def test_the_embedded_default_seals_secrets_under_a_key_of_its_own(tmp_path: Path) -> None:
    """No SETFLOW_SECRET_KEY and no database of its own: a key file beside the SQLite file,
    0600, the same for every process of the machine; a database of its own needs the setting."""
    import stat

    from runtime.settings import deployment_key
    s = Settings(data_dir=tmp_path / "data")
    key = deployment_key(s)
    assert key and deployment_key(s) == key, "one key, read again by the next process"
    assert stat.S_IMODE((tmp_path / "data" / "secret.key").stat().st_mode) == 0o600
    assert deployment_key(Settings(data_dir=tmp_path / "data", secret_key="k" * 16)) == "k" * 16
    assert deployment_key(Settings(data_dir=tmp_path / "other", database_url="postgresql+psycopg://x/y")) is None
