"""/v1/webhooks on a real Redis and SQLite (no worker): an endpoint's secret is shown once, at
its creation; another tenant's endpoint does not exist; a bad url or an unknown event type is a
422 that writes nothing; the cap is a 409; a delete drops the endpoint's pending messages.  And
end to end: a job ends, the sender delivers to a real receiver, and the body verifies with the
secret the API gave."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import func, select
from standardwebhooks import Webhook

from runtime.api.routes import webhooks as routes
from runtime.tables import IdempotencyRecord, WebhookEndpointRecord, WebhookMessageRecord
from runtime.webhooks.sender import WebhookSender
from tests.receiver import receiver
from tests.runtime.api.conftest import ACME, GLOBEX, Api


def _with_routes(api: Api) -> Api:
    """The app with /v1/webhooks (included here where app.py does not include it yet)."""
    if not any(getattr(r, "path", "").startswith("/v1/webhooks") for r in api.app.routes):
        api.app.include_router(routes.router)
    return api


@pytest.fixture
def hooks(api: Api) -> Api:
    return _with_routes(api)


def _counts(api: Api) -> tuple[int, int]:
    with api.svc.sql.connect() as c:
        return (int(c.scalar(select(func.count()).select_from(WebhookEndpointRecord)) or 0),
                int(c.scalar(select(func.count()).select_from(WebhookMessageRecord)) or 0))


def _end_job(api: Api, tenant: str = "acme", kind: str = "narrative", result: dict[str, Any] | None = None) -> str:
    """A job that ran and succeeded, as a worker ends it (no worker here)."""
    job, _ = api.svc.jobs.create(kind, tenant, {"x": 1})
    owner = api.svc.jobs.claim(job.id, "w1").owner
    assert owner is not None
    api.svc.jobs.finish(job.id, owner, "succeeded", result=result)
    return job.id


def test_the_secret_is_shown_once_and_another_tenant_sees_nothing(hooks: Api) -> None:
    h = hooks.http
    r = h.post("/v1/webhooks", json={"url": "https://example.com/hooks", "events": ["response.completed"],
                                     "description": "prod"}, headers=ACME)
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["secret"].startswith("whsec_") and made["id"].startswith("we_")
    assert (made["url"], made["events"], made["description"]) == ("https://example.com/hooks",
                                                                  ["response.completed"], "prod")
    listed = h.get("/v1/webhooks", headers=ACME).json()["webhooks"]
    assert [w["id"] for w in listed] == [made["id"]] and "secret" not in listed[0]
    got = h.get(f"/v1/webhooks/{made['id']}", headers=ACME).json()
    assert "secret" not in got and made["secret"] not in str(got)
    assert got["deliveries"] == {"pending": 0, "delivered": 0, "failed": 0}
    assert h.get("/v1/webhooks", headers=GLOBEX).json()["webhooks"] == []
    assert h.get(f"/v1/webhooks/{made['id']}", headers=GLOBEX).status_code == 404
    assert h.delete(f"/v1/webhooks/{made['id']}", headers=GLOBEX).status_code == 404
    assert h.get("/v1/webhooks/we_" + "0" * 24, headers=ACME).status_code == 404
    assert h.get("/v1/webhooks/we_nope", headers=ACME).status_code == 422  # not an endpoint's id at all
    assert h.get(f"/v1/webhooks/{made['id']}").status_code == 401


BAD: list[tuple[dict[str, Any], str]] = [
    ({"url": "ftp://example.com/x"}, "url"),
    ({"url": "example.com/hooks"}, "url"),
    ({"url": "https://example.com/" + "a" * 2048}, "url"),
    ({"url": "https://example.com", "events": ["response.created"]}, "events"),
    ({"url": "https://example.com", "events": "job.failed"}, "events"),
    ({"url": "https://example.com", "secret": "whsec_mine"}, "secret"),  # the runtime makes the secret
    ({"events": ["job.failed"]}, "url"),
]


@pytest.mark.parametrize(("body", "field"), BAD)
def test_a_bad_endpoint_is_a_422_and_writes_nothing(hooks: Api, body: dict[str, Any], field: str) -> None:
    before = hooks.snapshot(), _counts(hooks)
    r = hooks.http.post("/v1/webhooks", json=body, headers=ACME)
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_input" and field in r.json()["error"]["message"]
    assert (hooks.snapshot(), _counts(hooks)) == before


def test_past_the_cap_is_a_409_over_budget(make_api: Any) -> None:
    api = _with_routes(make_api(tenant_max_webhooks=2))
    for i in range(2):
        assert api.http.post("/v1/webhooks", json={"url": f"https://example.com/{i}"}, headers=ACME).status_code == 201
    r = api.http.post("/v1/webhooks", json={"url": "https://example.com/3"}, headers=ACME)
    assert r.status_code == 409 and r.json()["error"]["code"] == "over_budget", r.text
    assert _counts(api) == (2, 0)
    assert api.http.post("/v1/webhooks", json={"url": "https://example.com/3"}, headers=GLOBEX).status_code == 201


def test_delete_drops_the_pending_messages(hooks: Api) -> None:
    h = hooks.http
    made = h.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/never"}, headers=ACME).json()
    _end_job(hooks), _end_job(hooks), _end_job(hooks, tenant="globex")
    assert h.get(f"/v1/webhooks/{made['id']}", headers=ACME).json()["deliveries"] == {
        "pending": 2, "delivered": 0, "failed": 0}
    assert h.delete(f"/v1/webhooks/{made['id']}", headers=ACME).status_code == 204
    assert _counts(hooks) == (0, 0)
    assert h.get(f"/v1/webhooks/{made['id']}", headers=ACME).status_code == 404
    assert h.delete(f"/v1/webhooks/{made['id']}", headers=ACME).status_code == 404


def test_a_job_ending_reaches_the_receiver_signed_with_the_secret_the_api_gave(hooks: Api) -> None:
    with receiver() as rx:
        made = hooks.http.post("/v1/webhooks", json={"url": rx.url}, headers=ACME).json()
        job_id = _end_job(hooks, kind="response", result={"status": "completed"})
        sender = WebhookSender(hooks.svc.sql, hooks.s, wait_s=math.inf)
        assert sender.deliver_due()["delivered"] == 1
        sender.close()
    (got,) = rx.got
    body = Webhook(made["secret"]).verify(got.body, got.headers)
    assert (body["type"], body["data"]) == ("response.completed", {"id": f"resp_{job_id}"})
    assert hooks.http.get(f"/v1/webhooks/{made['id']}", headers=ACME).json()["deliveries"] == {
        "pending": 0, "delivered": 1, "failed": 0}


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379/", "http://localhost:8000/hooks", "http://[::1]/x",
                                 "http://10.0.0.5/hooks", "http://169.254.169.254/latest/meta-data", "http://0.0.0.0/",
                                 "http://api.localhost/x"])
def test_a_url_into_the_deployments_own_network_is_refused_by_default(make_api: Any, url: str) -> None:
    """A tenant must not make the workers POST to Redis, the database or a cloud's metadata
    service (SSRF): a loopback, private or link-local host is a 422 unless the deployment sets
    webhook_allow_private (a name is checked at each delivery: tests/runtime/jobs/test_webhooks.py)."""
    api = _with_routes(make_api(webhook_allow_private=False))
    before = api.snapshot(), _counts(api)
    r = api.http.post("/v1/webhooks", json={"url": url}, headers=ACME)
    assert r.status_code == 422 and "public addresses only" in r.json()["error"]["message"], r.text
    assert (api.snapshot(), _counts(api)) == before
    assert api.http.post("/v1/webhooks", json={"url": "https://example.com/hooks"}, headers=ACME).status_code == 201


def test_an_idempotent_creation_keeps_and_replays_no_secret(make_api: Any) -> None:
    """POST /v1/webhooks with an Idempotency-Key: the first answer has the secret; what the key
    keeps (24 h, in SQL) does not, and the replay answers the same endpoint without it."""
    api = _with_routes(make_api(secret_key="k" * 32))
    headers = {**ACME, "Idempotency-Key": "hook-1"}
    first = api.http.post("/v1/webhooks", json={"url": "https://example.com/hooks"}, headers=headers)
    assert first.status_code == 201 and first.json()["secret"].startswith("whsec_"), first.text
    assert "setflow-unkept" not in first.headers
    secret = first.json()["secret"]
    with api.svc.sql.connect() as c:
        kept = [str(a) for a in c.scalars(select(IdempotencyRecord.answer))]
        stored = c.scalar(select(WebhookEndpointRecord.secret))
    assert kept and not any(secret in a or secret.removeprefix("whsec_") in a for a in kept), kept
    assert stored is not None and stored.startswith("sealed1:") and secret.removeprefix("whsec_") not in stored
    again = api.http.post("/v1/webhooks", json={"url": "https://example.com/hooks"}, headers=headers)
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert "secret" not in again.json() and again.json() == {k: v for k, v in first.json().items() if k != "secret"}
    assert _counts(api) == (1, 0), "created once"
    plain = api.http.post("/v1/webhooks", json={"url": "https://example.com/other"}, headers=ACME)
    assert plain.json()["secret"].startswith("whsec_") and "setflow-unkept" not in plain.headers


def test_a_sealed_secret_signs_what_the_receiver_verifies_with_the_secret_the_api_gave(make_api: Any) -> None:
    api = _with_routes(make_api(secret_key="k" * 32))
    with receiver() as rx:
        made = api.http.post("/v1/webhooks", json={"url": rx.url}, headers=ACME).json()
        _end_job(api)
        sender = WebhookSender(api.svc.sql, api.s, wait_s=math.inf)
        assert sender.deliver_due()["delivered"] == 1
        sender.close()
    (got,) = rx.got
    assert Webhook(made["secret"]).verify(got.body, got.headers)["type"] == "job.succeeded"
