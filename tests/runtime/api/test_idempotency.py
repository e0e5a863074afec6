"""Idempotency-Key on every POST (runtime/api/idempotency.py): the same key and body replay the
first answer (the same job), another body is refused and changes nothing, 8 concurrent
duplicates make one job (SQLite and PostgreSQL), a key survives an API restart, an answer that
says "retry later" (429) frees the key, a key left in flight by a dead process is taken over, and
the Responses route replays its response (and its stream)."""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy.orm import Session

from app.serve import ApiServer
from runtime.api import idempotency
from runtime.jobs import hosts as models
from runtime.tables import IdempotencyRecord
from tests.conftest import pg_schema
from tests.runtime.api.conftest import ACME, GLOBEX, NARRATIVE, Api, api_server, api_settings, delete_keys, shipped_card


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


def test_a_retry_later_answer_frees_the_key(make_api: Callable[..., Api]) -> None:
    """A 429 (its Retry-After says when to come back) is not kept: the retry with the same key,
    once the bucket has refilled, runs the request."""
    api = make_api(tenant_burst=1, tenant_rate_per_s=2.0)  # a token each 0.5 s: the second request comes sooner
    assert api.http.post("/v1/sessions", headers=ACME).status_code == 201  # the bucket's one token
    refused = api.http.post("/v1/sessions", headers=keyed("k-429"))
    assert refused.status_code == 429 and refused.headers["retry-after"]
    for _ in range(50):  # the next token within 0.5 s
        time.sleep(0.1)
        again = api.http.post("/v1/sessions", headers=keyed("k-429"))
        if again.status_code != 429:
            break
    assert again.status_code == 201 and "idempotent-replayed" not in again.headers


def _in_flight(api: Api, key: str, age_s: float) -> None:
    """The row a request to POST /v1/sessions holds while it runs, written `age_s` ago."""
    with Session(api.svc.sql) as db, db.begin():
        db.add(IdempotencyRecord(tenant="acme", key=key, route="POST /v1/sessions",
                                 body_hash=hashlib.sha256(b"").hexdigest(),
                                 created_at=datetime.now(UTC) - timedelta(seconds=age_s)))


def test_a_key_in_flight_is_waited_for_and_one_left_by_a_dead_process_is_taken_over(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idempotency, "WAIT_S", 0.3)
    _in_flight(api, "k-running", 1.0)  # its request still runs: a duplicate waits, then 409
    r = api.http.post("/v1/sessions", headers=keyed("k-running"))
    assert r.status_code == 409 and r.json()["error"]["code"] == "idempotency_in_flight" and r.headers["retry-after"]
    # in flight past any request's time (response_wait_s, the longest, and a margin): its process died
    _in_flight(api, "k-dead", api.s.response_wait_s + idempotency.ABANDONED_S + 5)
    r = api.http.post("/v1/sessions", headers=keyed("k-dead"))
    assert r.status_code == 201 and "idempotent-replayed" not in r.headers
    again = api.http.post("/v1/sessions", headers=keyed("k-dead"))
    assert again.headers["idempotent-replayed"] == "true" and again.json() == r.json()


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


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """None: the API's SQLite file; else a fresh PostgreSQL schema (skipped where none answers)."""
    if request.param == "sqlite":
        yield None
    else:
        with pg_schema() as url:
            yield url


def _burst(url: str, path: str, key: str, body: dict[str, object] | None = None) -> list[tuple[int, str]]:
    """8 identical POSTs at once (threads released together): each one's (status, id)."""
    out: list[tuple[int, str]] = []
    go = threading.Barrier(8)

    def post() -> None:
        go.wait()
        r = httpx.post(f"{url}{path}", headers=keyed(key), json=body, timeout=60)
        json = r.headers.get("content-type", "").startswith("application/json")
        out.append((r.status_code, r.json().get("id", r.text) if json else r.text))

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_eight_concurrent_duplicates_make_one_job_and_a_key_survives_a_restart(
        redis_url: str, tmp_path: Path, database_url: str | None) -> None:
    s = api_settings(redis_url, tmp_path, api_port=0, tenant_burst=100, tenant_rate_per_s=100.0,
                     database_url=database_url)
    mine = redis.Redis.from_url(redis_url)
    models.publish(mine, s, shipped_card())
    server = ApiServer(s, port=0).start()
    try:
        out = _burst(server.url, "/v1/jobs", "k-8", {"kind": "narrative", "spec": NARRATIVE})
        assert len(out) == 8 and {code for code, _ in out} == {202} and len({i for _, i in out}) == 1, out
        jobs = httpx.get(f"{server.url}/v1/jobs", headers=ACME).json()["jobs"]
        assert [j["id"] for j in jobs] == [out[0][1]], "one job"
        server.stop()
        server = ApiServer(s, port=0).start()  # a restart: the key is in SQL
        r = httpx.post(f"{server.url}/v1/jobs", headers=keyed("k-8"), json={"kind": "narrative", "spec": NARRATIVE})
        assert r.headers["idempotent-replayed"] == "true" and r.json()["id"] == out[0][1]
        # a key past its TTL is free again, and 8 duplicates racing to take it still run once
        with Session(server.app.state.services.sql) as db, db.begin():
            db.add(IdempotencyRecord(tenant="acme", key="k-old", route="POST /v1/sessions", body_hash="0" * 64,
                                     status=201, answer={"body": "{}"},
                                     created_at=datetime.now(UTC) - timedelta(seconds=s.idempotency_ttl_s + 5)))
        out = _burst(server.url, "/v1/sessions", "k-old")
        assert {code for code, _ in out} == {201} and len({i for _, i in out}) == 1, out
    finally:
        server.stop()
        delete_keys(redis_url, f"{s.key_prefix}*")
        mine.close()


def _until(cond: Callable[[], bool], what: str) -> None:
    """Wait for a state (not a moment): up to 30 s, however busy the machine."""
    end = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(0.02)


def test_duplicates_pay_at_the_door(make_api: Callable[..., Api], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each duplicate takes a rate-limit token: past the bucket it is a 429, not one more wait."""
    monkeypatch.setattr(idempotency, "WAIT_S", 0.2)
    api = make_api(tenant_burst=2, tenant_rate_per_s=0.01)
    _in_flight(api, "k-held", 1.0)
    codes = [api.http.post("/v1/sessions", headers=keyed("k-held")).status_code for _ in range(3)]
    assert codes == [409, 409, 429]


def test_a_tenant_holds_at_most_its_keys(make_api: Callable[..., Api]) -> None:
    api = make_api(idempotency_max_keys=2)
    assert [api.http.post("/v1/sessions", headers=keyed(f"k-q{i}")).status_code for i in range(2)] == [201, 201]
    before = api.snapshot()
    r = api.http.post("/v1/sessions", headers=keyed("k-q2"))
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited" and "idempotency_max_keys" in r.text
    assert api.snapshot() == before, "a refused key writes nothing"
    assert api.http.post("/v1/sessions", headers=keyed("k-q0")).headers["idempotent-replayed"] == "true"
    assert api.http.post("/v1/sessions", headers=ACME).status_code == 201  # without a key: as ever


def test_waiting_duplicates_are_capped_wake_on_the_answer_and_stop_with_their_client(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idempotency, "MAX_WAITING", 2)
    monkeypatch.setattr(idempotency, "POLL_S", 0.05)
    waiting = idempotency.Idempotent._waiting
    with api_server(redis_url, tmp_path) as server:
        sql = server.app.state.services.sql
        keys = idempotency.Keys(sql, 3600, 60)
        _hold(sql, "k-wait")
        answers: list[httpx.Response] = []

        def post() -> None:
            answers.append(httpx.post(f"{server.url}/v1/sessions", headers=keyed("k-wait"), timeout=60))
        threads = [threading.Thread(target=post) for _ in range(2)]
        for t in threads:
            t.start()
        _until(lambda: waiting.get("acme") == 2, "two duplicates wait")
        third = httpx.post(f"{server.url}/v1/sessions", headers=keyed("k-wait"), timeout=60)
        assert third.status_code == 429 and third.json()["error"]["code"] == "rate_limited"
        keys.answer("acme", "k-wait", 201, {"body": '{"id": "s-1"}', "type": "application/json"})  # the first answers
        for t in threads:
            t.join(30)
        assert [(r.status_code, r.json(), r.headers["idempotent-replayed"]) for r in answers] == [(201, {"id": "s-1"}, "true")] * 2
        assert "acme" not in waiting
        # a duplicate whose client leaves stops waiting (WAIT_S is a minute)
        _hold(sql, "k-gone")
        host, port = server.url.split("//")[1].split(":")
        s = socket.create_connection((host, int(port)))
        s.sendall(f"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: {ACME['Authorization']}\r\n"
                  "Idempotency-Key: k-gone\r\nContent-Length: 0\r\n\r\n".encode())
        _until(lambda: waiting.get("acme") == 1, "the duplicate waits")
        s.close()
        _until(lambda: "acme" not in waiting, "the duplicate stops waiting once its client left")


def _hold(sql: Any, key: str) -> None:
    with Session(sql) as db, db.begin():
        db.add(IdempotencyRecord(tenant="acme", key=key, route="POST /v1/sessions", body_hash=hashlib.sha256(b"").hexdigest()))
