"""Issue 31 at the API: no tenant can fill Redis for the others.  A tenant looping submit and
cancel is refused at its event quota (429 rate_limited, naming it), writing nothing, while
another tenant is served; cancels and reads that open event streams take rate-limit tokens; a
global cap on open streams per process; a submission to a Redis at its maxmemory gets 503
store_full with Retry-After and writes nothing to SQL."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from runtime.embedded import EmbeddedRedis
from tests.runtime.api.conftest import ACME, GLOBEX, NARRATIVE, Api, running_api

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
    _error(api.http.post("/v1/jobs/0123456789abcdef01234567/cancel", headers=ACME), 404, "not_found")  # no token
    job = api.http.post("/v1/jobs", headers=ACME, json=JOB).json()["id"]  # token 1
    assert api.http.post(f"/v1/jobs/{job}/cancel", headers=ACME).status_code == 200  # 2
    events = api.http.get(f"/v1/jobs/{job}/events", headers=ACME)  # 3: a finished job's stream ends
    assert events.status_code == 200 and "event: result" in events.text
    assert "requests/s" in _error(api.http.post(f"/v1/jobs/{job}/cancel", headers=ACME), 429, "rate_limited")
    _error(api.http.get(f"/v1/jobs/{job}/events", headers=ACME), 429, "rate_limited")
    # over its rate, a tenant's writes are refused at the door (runtime/api/gate.py), a 404 too
    r = api.http.post("/v1/jobs/0123456789abcdef01234567/cancel", headers=ACME)
    assert "retry after" in _error(r, 429, "rate_limited") and int(r.headers["Retry-After"]) >= 1

    api = make_api(tenant_burst=3, tenant_rate_per_s=0.01)
    resp = api.http.post("/v1/responses", headers=ACME, json={"input": "Hello.", "background": True}).json()["id"]
    assert api.http.post(f"/v1/responses/{resp}/cancel", headers=ACME).status_code == 200
    assert api.http.get(f"/v1/responses/{resp}?stream=true", headers=ACME).status_code == 200
    assert api.http.get(f"/v1/responses/{resp}", headers=ACME).status_code == 200, "a plain read is not metered"
    assert api.http.get(f"/v1/responses/{resp}?stream=true", headers=ACME).status_code == 429
    assert api.http.post(f"/v1/responses/{resp}/cancel", headers=ACME).status_code == 429


def test_a_deleted_responses_stream_leaves_its_tenants_event_account_at_once(api: Api) -> None:
    """Not 24 h later, when the sweep would find it gone: a client that deletes what it created
    (or sends store false) is not refused for streams it no longer has."""
    resp = api.http.post("/v1/responses", headers=ACME, json={"input": "Hello.", "background": True}).json()["id"]
    api.http.post(f"/v1/responses/{resp}/cancel", headers=ACME)
    assert api.svc.dispatcher.events.tenant_bytes("acme") > 0
    assert api.http.delete(f"/v1/responses/{resp}", headers=ACME).json()["deleted"] is True
    assert api.svc.dispatcher.events.tenant_bytes("acme") == 0


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


def test_a_submission_to_a_redis_at_its_maxmemory_gets_store_full_and_writes_nothing(tmp_path: Path) -> None:
    """A Redis of its own (the bundled server), pushed past its maxmemory once the API is up:
    the submission's first Redis write (its rate-limit token) is refused with OOM before its SQL
    row, and the API says so (503 store_full, Retry-After), not 503 unavailable."""
    with tempfile.TemporaryDirectory(prefix="sfr") as d, EmbeddedRedis(d) as server, \
            running_api(server.url, tmp_path) as api:
        r = redis.Redis.from_url(server.url)
        sql = api.sql_state()
        r.config_set("maxmemory", max(1, int(r.info("memory")["used_memory"]) // 2))
        for method, path, body in (("POST", "/v1/jobs", JOB), ("POST", "/v1/sessions", None)):
            out = api.http.request(method, path, headers=ACME, json=body)
            assert "maxmemory" in _error(out, 503, "store_full") and out.headers["Retry-After"] == "30"
        assert api.sql_state() == sql, "nothing written to SQL"
        r.config_set("maxmemory", 0)
        assert api.http.post("/v1/jobs", headers=ACME, json=JOB).status_code == 202
        r.close()


def test_a_dataset_upload_takes_a_token_per_64_kib(make_api: Callable[..., Api]) -> None:
    """Its parse and check cost by size: 10k rows of JSON (~0.6 MB) take about 11 tokens, a
    small one takes 1; a refused one has paid too."""
    api = make_api(tenant_burst=30, tenant_rate_per_s=0.001)
    rows = [{"metric": f"m{i % 97}", "region": f"r{i // 97}", "period": "2026-Q3", "value": i} for i in range(10_000)]
    body = json.dumps({"rows": rows}).encode()

    def tokens() -> float:
        return float(api.r.hget(api.keys.bucket("acme"), "tokens") or 30)

    before = tokens()
    r = api.http.put("/v1/datasets/big", content=body, headers={**ACME, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert round(before - tokens()) == 1 + len(body) // (64 * 1024) >= 9
    before = tokens()
    small = {"rows": [{"metric": "m", "region": "r", "period": "2026-Q3", "value": 1}]}
    assert api.http.put("/v1/datasets/small", headers=ACME, json=small).status_code == 200
    assert round(before - tokens()) == 1
