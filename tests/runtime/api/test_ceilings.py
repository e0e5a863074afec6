"""Issue 31 at the API: no tenant can fill Redis for the others.  A tenant looping submit and
cancel is refused at its event quota (429 rate_limited, naming it), writing nothing, while
another tenant is served; cancels and reads that open event streams take rate-limit tokens; a
global cap on open streams per process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.runtime.api.conftest import ACME, GLOBEX, NARRATIVE, Api

JOB = {"kind": "narrative", "spec": NARRATIVE}


def _error(r: Any, status: int, code: str) -> str:
    """The error's message, once its status and code are checked (r: an httpx response)."""
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert body["code"] == code, body
    return str(body["message"])


def test_a_tenant_looping_submit_and_cancel_is_refused_at_its_event_quota_and_another_is_not(
        make_api: Callable[..., Api]) -> None:
    api = make_api(tenant_max_event_bytes=40_000)
    for _ in range(100):  # each job's stream: its queued and cancelled events, ~4.7 KB
        r = api.http.post("/v1/jobs", headers=ACME, json=JOB)
        if r.status_code != 202:
            break
        assert api.http.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=ACME).json()["status"] == "cancelled"
    else:
        raise AssertionError("never refused")
    assert "tenant_max_event_bytes 40000" in _error(r, 429, "rate_limited") and int(r.headers["Retry-After"]) >= 1
    assert 40_000 <= api.svc.dispatcher.events.tenant_bytes("acme") < 50_000, "refused well before more"
    before = api.snapshot()
    _error(api.http.post("/v1/jobs", headers=ACME, json=JOB), 429, "rate_limited")
    assert api.snapshot() == before, "a refused submission writes nothing"
    assert api.http.post("/v1/jobs", headers=GLOBEX, json=JOB).status_code == 202, "another tenant is served"


def test_cancels_and_reads_that_open_event_streams_take_a_token(make_api: Callable[..., Api]) -> None:
    api = make_api(tenant_burst=3, tenant_rate_per_s=0.01)
    job = api.http.post("/v1/jobs", headers=ACME, json=JOB).json()["id"]  # token 1
    assert api.http.post(f"/v1/jobs/{job}/cancel", headers=ACME).status_code == 200  # 2
    events = api.http.get(f"/v1/jobs/{job}/events", headers=ACME)  # 3: a finished job's stream ends
    assert events.status_code == 200 and "event: result" in events.text
    assert "jobs/s" in _error(api.http.post(f"/v1/jobs/{job}/cancel", headers=ACME), 429, "rate_limited")
    _error(api.http.get(f"/v1/jobs/{job}/events", headers=ACME), 429, "rate_limited")
    _error(api.http.post("/v1/jobs/0123456789abcdef01234567/cancel", headers=ACME), 404, "not_found")  # 404 first

    api = make_api(tenant_burst=3, tenant_rate_per_s=0.01)
    resp = api.http.post("/v1/responses", headers=ACME, json={"input": "Hello.", "background": True}).json()["id"]
    assert api.http.post(f"/v1/responses/{resp}/cancel", headers=ACME).status_code == 200
    assert api.http.get(f"/v1/responses/{resp}?stream=true", headers=ACME).status_code == 200
    assert api.http.get(f"/v1/responses/{resp}", headers=ACME).status_code == 200, "a plain read is not metered"
    assert api.http.get(f"/v1/responses/{resp}?stream=true", headers=ACME).status_code == 429
    assert api.http.post(f"/v1/responses/{resp}/cancel", headers=ACME).status_code == 429


def test_open_streams_are_capped_per_process_across_tenants(make_api: Callable[..., Api]) -> None:
    api = make_api(max_streams=2)
    job = api.http.post("/v1/jobs", headers=ACME, json=JOB).json()["id"]
    api.http.post(f"/v1/jobs/{job}/cancel", headers=ACME)
    api.svc.streams["globex"] = 2  # globex holds the process's streams
    try:
        assert "max_streams" in _error(api.http.get(f"/v1/jobs/{job}/events", headers=ACME), 429, "rate_limited")
    finally:
        api.svc.streams["globex"] = 0
    assert api.http.get(f"/v1/jobs/{job}/events", headers=ACME).status_code == 200
