"""Idempotency-Key on every POST (runtime/api/idempotency.py): the same key and body replay the
first answer (the same job), another body is refused and changes nothing, 8 concurrent
duplicates make one job, a key survives an API restart, a 5xx frees the key, and the Responses
route replays its response (and its stream)."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import redis

from app.serve import ApiServer
from runtime.jobs import models
from tests.runtime.api.conftest import ACME, GLOBEX, NARRATIVE, Api, api_settings, delete_keys, shipped_card


def keyed(key: str) -> dict[str, str]:
    return {**ACME, "Idempotency-Key": key}


def test_the_same_key_and_body_replay_the_first_answer(api: Api) -> None:
    first = api.http.post("/v1/jobs", headers=keyed("k-1"), json={"kind": "narrative", "spec": NARRATIVE})
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    before = api.snapshot()
    again = api.http.post("/v1/jobs", headers=keyed("k-1"), json={"kind": "narrative", "spec": NARRATIVE})
    assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert api.snapshot() == before, "a replay writes nothing"
    other = api.http.post("/v1/jobs", headers={**GLOBEX, "Idempotency-Key": "k-1"},
                          json={"kind": "narrative", "spec": NARRATIVE})
    assert other.json()["id"] != first.json()["id"], "a key is the tenant's own"
    plain = api.http.post("/v1/sessions", headers=ACME)
    assert plain.status_code == 201 and api.http.post("/v1/sessions", headers=ACME).json()["id"] != plain.json()["id"]


def test_another_body_or_route_under_the_key_is_refused_and_changes_nothing(api: Api) -> None:
    api.http.post("/v1/jobs", headers=keyed("k-2"), json={"kind": "narrative", "spec": NARRATIVE})
    before = api.snapshot()
    for path, body in [("/v1/jobs", {"kind": "narrative", "spec": {**NARRATIVE, "allow_unverified": True}}),
                       ("/v1/sessions", None)]:
        r = api.http.post(path, headers=keyed("k-2"), json=body)
        assert r.status_code == 422 and r.json()["error"]["code"] == "idempotency_mismatch", r.text
    r = api.http.post("/v1/responses", headers=keyed("k-2"), json={"model": "small", "input": "hi", "background": True})
    assert r.status_code == 400 and r.json()["error"]["code"] == "idempotency_mismatch"  # OpenAI's shape there
    assert api.snapshot() == before
    bad = api.http.post("/v1/sessions", headers=keyed("a key with spaces"))
    assert bad.status_code == 422 and api.snapshot() == before


def test_a_refusal_is_replayed_and_a_request_without_a_tenant_writes_no_key(api: Api) -> None:
    bad = {"kind": "narrative", "spec": {"payload": {}}}
    first = api.http.post("/v1/jobs", headers=keyed("k-3"), json=bad)
    again = api.http.post("/v1/jobs", headers=keyed("k-3"), json=bad)
    assert first.status_code == again.status_code == 422 and again.json() == first.json()
    anonymous = api.http.post("/v1/sessions", headers={"Idempotency-Key": "k-4"})
    assert anonymous.status_code == 401
    assert api.http.post("/v1/sessions", headers=keyed("k-4")).status_code == 201  # the key was never taken


def test_the_responses_route_replays_its_response_and_its_stream(api: Api) -> None:
    body = {"model": "small", "input": "Revenue rose", "background": True}
    first = api.http.post("/v1/responses", headers=keyed("r-1"), json=body)
    again = api.http.post("/v1/responses", headers=keyed("r-1"), json=body)
    assert first.status_code == 200 and again.json()["id"] == first.json()["id"]
    rid = first.json()["id"]
    api.http.post(f"/v1/responses/{rid}/cancel", headers=ACME)  # no worker here: it ends now, its stream with it
    streamed = {"model": "small", "input": "Churn fell", "stream": True}
    with api.http.stream("POST", "/v1/responses", headers=keyed("r-2"), json=streamed) as r:
        name = r.headers["setflow-response-id"]
        api.http.post(f"/v1/responses/{name}/cancel", headers=ACME)
        text = r.read().decode()
    with api.http.stream("POST", "/v1/responses", headers=keyed("r-2"), json=streamed) as r:
        assert r.headers["idempotent-replayed"] == "true"
        replay = r.read().decode()
    assert replay == text and f'"id":"{name}"' in replay and "response.cancelled" in replay


def test_eight_concurrent_duplicates_make_one_job_and_a_key_survives_a_restart(redis_url: str, tmp_path: Path) -> None:
    s = api_settings(redis_url, tmp_path, api_port=0, tenant_burst=100, tenant_rate_per_s=100.0)
    mine = redis.Redis.from_url(redis_url)
    models.publish(mine, s, shipped_card())
    server = ApiServer(s, port=0).start()
    try:
        ids: list[str] = []
        go = threading.Barrier(8)

        def post() -> None:
            go.wait()
            r = httpx.post(f"{server.url}/v1/jobs", headers=keyed("k-8"), timeout=60,
                           json={"kind": "narrative", "spec": NARRATIVE})
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])

        threads = [threading.Thread(target=post) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(ids) == 8 and len(set(ids)) == 1
        jobs = httpx.get(f"{server.url}/v1/jobs", headers=ACME).json()["jobs"]
        assert [j["id"] for j in jobs] == ids[:1], "one job"
        server.stop()
        server = ApiServer(s, port=0).start()  # a restart: the key is in SQL
        r = httpx.post(f"{server.url}/v1/jobs", headers=keyed("k-8"), json={"kind": "narrative", "spec": NARRATIVE})
        assert r.headers["idempotent-replayed"] == "true" and r.json()["id"] == ids[0]
    finally:
        server.stop()
        delete_keys(redis_url, f"{s.key_prefix}*")
        mine.close()
