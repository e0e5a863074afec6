"""A tenant's SQL quotas at the API (runtime/sessions/quota.py): past tenant_max_sessions or
tenant_max_turn_bytes, creating a session, forking one, opening a conversation or submitting a
job is 409 over_budget naming the setting, and changes nothing; another tenant is unaffected."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import update
from sqlalchemy.orm import Session

from runtime.tables import JobRecord
from tests.runtime.api.conftest import ACME, GLOBEX, NARRATIVE, Api


def _refused(r: httpx.Response, setting: str) -> None:
    body = r.json()
    assert r.status_code == 409 and body["error"]["code"] == "over_budget" and setting in body["error"]["message"], body


def test_past_its_sessions_a_tenant_opens_none_and_nothing_changes(make_api: Callable[..., Api]) -> None:
    api = make_api(tenant_max_sessions=3)
    sid = api.seed_session("acme", turns=1)
    assert api.http.post("/v1/sessions", headers=ACME).status_code == 201
    assert api.http.post(f"/v1/sessions/{sid}/fork", headers=ACME, json={"turn": 0}).status_code == 201
    before = api.snapshot()
    _refused(api.http.post("/v1/sessions", headers=ACME), "tenant_max_sessions")
    _refused(api.http.post(f"/v1/sessions/{sid}/fork", headers=ACME, json={"turn": 0}), "tenant_max_sessions")
    _refused(api.http.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE}),
             "tenant_max_sessions")
    _refused(api.http.post("/v1/conversations", headers=ACME, json={}), "tenant_max_sessions")
    assert api.snapshot() == before
    assert api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json={"text": "hi"}).status_code == 202
    assert api.http.post("/v1/sessions", headers=GLOBEX).status_code == 201


def test_a_fork_loop_stops_at_the_turn_bytes_quota(make_api: Callable[..., Api]) -> None:
    probe = make_api()
    sid = probe.seed_session("acme", turns=2)
    size = sum(t.bytes for t in probe.svc.records.turns(sid, "acme"))
    api = make_api(tenant_max_turn_bytes=3 * size)
    sid = api.seed_session("acme", turns=2)
    codes = [api.http.post(f"/v1/sessions/{sid}/fork", headers=ACME, json={"turn": 1}).status_code
             for _ in range(5)]
    assert codes == [201, 201, 409, 409, 409]
    before = api.snapshot()
    r = api.http.post(f"/v1/sessions/{sid}/fork", headers=ACME, json={"turn": 1})
    _refused(r, "tenant_max_turn_bytes")
    _refused(api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json={"text": "hi"}), "tenant_max_turn_bytes")
    assert api.snapshot() == before
    assert api.http.post(f"/v1/sessions/{sid}/fork", headers=GLOBEX, json={"turn": 1}).status_code == 404


def _stored(api: Api, tenant: str = "acme") -> int:
    from sqlalchemy import select

    from runtime.tables import TenantUsageRecord
    with Session(api.svc.sql) as db:
        return int(db.scalar(select(TenantUsageRecord.stored_bytes).where(TenantUsageRecord.tenant == tenant)) or 0)


def _store_things(api: Api) -> tuple[str, str]:
    """A narrative job that ended with a result, and a conversation with an unread item."""
    job = api.http.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE}).json()["id"]
    owner = api.svc.jobs.claim(job, "w").owner or ""
    api.svc.jobs.finish(job, owner, "succeeded", result={"text": "x" * 1000})
    conv = api.http.post("/v1/conversations", headers=ACME, json={
        "items": [{"type": "message", "role": "user", "content": "y" * 5000}]}).json()["id"]
    return job, conv


def test_every_byte_a_tenant_stores_is_counted_and_refused_past_its_quota(make_api: Callable[..., Api]) -> None:
    """Job specs and results, idempotency answers and unread conversation items count against
    tenant_max_stored_bytes: past it a submission is 409 over_budget naming it, and changes
    nothing; a delete and a session's delete give the bytes back."""
    from runtime.sessions import quota
    probe = make_api()
    job, _ = _store_things(probe)
    spec = quota.size(probe.svc.jobs.get(job).spec)
    assert probe.svc.jobs.get(job).nbytes == spec + quota.size({"text": "x" * 1000}, None)
    held = _stored(probe)
    assert held > spec + 6000
    api = make_api(tenant_max_stored_bytes=held + spec // 2)  # room for half a job more
    job, conv = _store_things(api)
    assert _stored(api) == held
    before = api.snapshot()
    _refused(api.http.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE}), "tenant_max_stored_bytes")
    _refused(api.http.post(f"/v1/conversations/{conv}/items", headers=ACME,
                           json={"items": [{"type": "message", "role": "user", "content": "w" * spec}]}),
             "tenant_max_stored_bytes")
    assert api.snapshot() == before
    other = api.http.post("/v1/jobs", headers=GLOBEX, json={"kind": "narrative", "spec": NARRATIVE})
    assert other.status_code == 202 and _stored(api, "globex") == spec, "another tenant is unaffected"
    ended = api.svc.jobs.get(job).nbytes
    api.svc.jobs.delete(job, "acme")
    assert _stored(api) == held - ended
    # the retention gives an ended job's bytes back
    api.svc.jobs.finish(other.json()["id"], api.svc.jobs.claim(other.json()["id"], "w").owner or "", "failed")
    with Session(api.svc.sql) as db, db.begin():
        db.execute(update(JobRecord).where(JobRecord.id == other.json()["id"]).values(
            finished_at=datetime.now(UTC) - timedelta(seconds=api.s.job_retention_s + 60)))
    assert api.svc.jobs.prune() == 1 and _stored(api, "globex") == 0
    assert api.http.delete(f"/v1/conversations/{conv}", headers=ACME).status_code == 200
    assert _stored(api) == 0, "every byte counted is given back"


def test_a_listing_loads_no_spec(api: Api) -> None:
    from sqlalchemy import inspect
    api.http.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE})
    rows = api.svc.jobs.listing("acme")
    assert rows and all("spec" not in inspect(r).dict for r in rows)
    assert api.http.get("/v1/jobs", headers=ACME).status_code == 200


def test_a_response_stores_its_input_once(api: Api) -> None:
    text = "Revenue rose in every region. " * 100  # 3,000 characters
    r = api.http.post("/v1/responses", headers=ACME, json={"model": "small", "input": text, "background": True})
    assert r.status_code == 200, r.text
    job = api.svc.jobs.get(r.json()["setflow"]["job"])
    assert job.nbytes < 1.2 * len(text), (job.nbytes, len(text))


def test_a_job_cancelled_before_it_ran_leaves_its_stream_soon(api: Api) -> None:
    job = api.http.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE}).json()["id"]
    assert api.http.post(f"/v1/jobs/{job}/cancel", headers=ACME).json()["status"] == "cancelled"
    ttl = api.r.ttl(api.svc.keys.events(job))
    assert 0 < ttl <= max(1, api.s.events_compact_after_s), ttl
