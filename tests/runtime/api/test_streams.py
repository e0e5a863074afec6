"""Event streams over real HTTP (uvicorn on a thread; no worker, so the job stays queued and its
stream stays open): many open streams hold no worker threads, so other requests and other
tenants are served meanwhile; a tenant's open streams are capped (429), and the cap is given
back when a stream closes."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import httpx
import pytest
import redis

from app.serve import ApiServer
from runtime.api.services import close_fully
from runtime.embedded import async_from_url
from tests.runtime.api.conftest import ACME, GLOBEX, NARRATIVE, api_server, running_api

OPEN = 45  # more than Starlette's pool of 40 threads, which a thread per stream would exhaust


@pytest.fixture
def server(redis_url: str, tmp_path: Path) -> Iterator[ApiServer]:
    with api_server(redis_url, tmp_path, max_streams_per_tenant=OPEN + 2) as srv:
        yield srv


def test_open_streams_hold_no_threads_and_are_capped_per_tenant(server: ApiServer) -> None:
    async def go() -> None:
        client = httpx.AsyncClient(base_url=server.url, timeout=httpx.Timeout(10.0))
        async with client as c, AsyncExitStack() as streams:
            job = (await c.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE})).json()
            url = f"/v1/jobs/{job['id']}/events"
            readers = []  # kept: a reader collected early closes its response
            for _ in range(OPEN):  # each open, its first bytes read: the stream is running
                r = await streams.enter_async_context(c.stream("GET", url, headers=ACME))
                assert r.status_code == 200
                readers.append(r.aiter_text())
                assert (await anext(readers[-1])).startswith("retry:")
            # every stream waits on its job; the API still answers, both tenants
            assert (await c.get("/healthz")).status_code == 200
            assert (await c.get("/v1/jobs", headers=GLOBEX)).json() == {"jobs": []}
            assert (await c.get(f"/v1/jobs/{job['id']}", headers=ACME)).json()["status"] == "queued"
            # the cap: two more, then 429
            for _ in range(2):
                r = await streams.enter_async_context(c.stream("GET", url, headers=ACME))
                assert r.status_code == 200
                readers.append(r.aiter_text())
                await anext(readers[-1])
            r = await c.get(url, headers=ACME)
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited" and r.headers["retry-after"]
            await streams.aclose()  # the client goes away: each stream ends and gives its place back
            for _ in range(50):
                async with c.stream("GET", url, headers=ACME) as r:
                    if r.status_code == 200:
                        return
                await asyncio.sleep(0.1)
            raise AssertionError("closed streams did not give their places back")
    asyncio.run(go())


def test_a_waiting_jobs_stream_says_so_from_sql_when_its_event_is_gone(server: ApiServer, redis_url: str) -> None:
    """A wait may outlast its event stream's TTL, or its requires_action event be lost: the
    stream says it from the job's row, with the calls to answer."""
    from tests.runtime.api.conftest import AGENT

    svc = server.app.state.services
    jobs = svc.jobs
    job, _ = jobs.create("agent", "acme", {**AGENT, "client_tools": ["metric"]}, None, open_session=True)
    owner = jobs.claim(job.id, "w1").owner
    assert owner is not None
    call = {"id": "call_1", "tool": "metric", "call": 'metric("churn", "APAC", "2026-Q3")',
            "arguments": {"metric": "churn", "region": "APAC", "period": "2026-Q3"}}
    jobs.suspend(job.id, owner, [call], 60)
    r = redis.Redis.from_url(redis_url)
    r.delete(svc.keys.events(job.id))  # no event says it waits
    r.close()
    with httpx.stream("GET", f"{server.url}/v1/jobs/{job.id}/events", headers=ACME, timeout=10.0) as s:
        event, data = "", ""
        for line in s.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and event == "status":
                break
    said = json.loads(data)
    assert said["status"] == "requires_action" and said["calls"] == [call] and said["from"] == "sql"
    assert jobs.claim(job.id, "w2").reason == "waiting for tool outputs"  # a late message does not take it
    assert jobs.get(job.id).status == "requires_action"


def test_a_response_stream_refused_at_the_cap_runs_nothing(redis_url: str, tmp_path: Path) -> None:
    """A streamed response past the tenant's stream cap is refused before its job: a 429 the
    client retries leaves no response running (nor kept, store false) behind it."""
    with api_server(redis_url, tmp_path, max_streams_per_tenant=1) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        job = c.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE}).json()
        with c.stream("GET", f"/v1/jobs/{job['id']}/events", headers=ACME) as held:
            assert held.status_code == 200
            reader = held.iter_text()  # kept: a reader collected early closes its response
            assert next(reader).startswith("retry:")
            for store in (True, False):
                r = c.post("/v1/responses", headers=ACME,
                           json={"model": "small", "input": "Revenue rose", "stream": True, "store": store})
                assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited", r.text
            assert [j["id"] for j in c.get("/v1/jobs", headers=ACME).json()["jobs"]] == [job["id"]]


def test_a_response_stream_that_loses_the_last_place_to_another_says_so_and_runs_nothing(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two streams that pass the route's check at once: the one over the cap when its stream
    starts answers OpenAI's error event (not an empty 200), and the response it created is
    cancelled (store false: not kept either)."""
    with running_api(redis_url, tmp_path) as api:
        checks: Iterator[None] = iter([])
        monkeypatch.setattr(api.svc, "streams_full", lambda who: next(checks, f"tenant {who!r} holds 16 event streams"))
        for store in (True, False):
            checks = iter([None, None])  # the route's two checks pass; another stream takes the place before it starts
            with api.http.stream("POST", "/v1/responses", headers=ACME,
                                 json={"model": "small", "input": "Revenue rose", "stream": True, "store": store}) as r:
                assert r.status_code == 200
                text = "".join(r.iter_text())
            events = [json.loads(line.removeprefix("data: ")) for line in text.splitlines() if line.startswith("data: ")]
            assert [(e["type"], e["code"]) for e in events] == [("error", "rate_limited")], text
            jobs = api.http.get("/v1/jobs", headers=ACME).json()["jobs"]
            if store:
                assert [j["status"] for j in jobs] == ["cancelled"], jobs
                kept = jobs[0]["id"]
            else:
                deadline = time.monotonic() + 10
                while [j["id"] for j in jobs] != [kept] and time.monotonic() < deadline:
                    time.sleep(0.1)
                    jobs = api.http.get("/v1/jobs", headers=ACME).json()["jobs"]
                assert [j["id"] for j in jobs] == [kept], "the store-false response is forgotten once cancelled"


def test_a_waiting_response_counts_as_a_stream_and_ends_with_its_client(redis_url: str, tmp_path: Path) -> None:
    """A response the call waits for (neither background nor stream) holds what a stream holds:
    it is refused past the stream cap before its job, and its wait ends when its client leaves
    (no worker runs here: the job stays queued, and the wait would last response_wait_s); a
    store-false one is then cancelled and forgotten, as nobody can read it."""
    with api_server(redis_url, tmp_path, max_streams_per_tenant=1) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        svc = srv.app.state.services
        job = c.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE}).json()
        with c.stream("GET", f"/v1/jobs/{job['id']}/events", headers=ACME) as held:
            reader = held.iter_text()  # kept: a reader collected early closes its response
            assert next(reader).startswith("retry:")
            r = c.post("/v1/responses", headers=ACME, json={"model": "small", "input": "Revenue rose"})
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited", r.text
        _until(lambda: svc.streams.get("acme", 0) == 0, "the event stream closed")
        for store in (True, False):
            host, port = srv.url.split("//")[1].split(":")
            body = json.dumps({"model": "small", "input": "Revenue rose", "store": store}).encode()
            s = socket.create_connection((host, int(port)))
            s.sendall(f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: {ACME['Authorization']}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            _until(lambda: svc.streams.get("acme", 0) == 1, "the response is waited for")
            s.close()
            _until(lambda: svc.streams.get("acme", 0) == 0, "the wait ended with its client")
        _until(lambda: len(c.get("/v1/jobs", headers=ACME).json()["jobs"]) == 2,
               "the store-false response is cancelled and forgotten; the stored one stays")
        kinds = {j["kind"]: j["status"] for j in c.get("/v1/jobs", headers=ACME).json()["jobs"]}
        assert kinds == {"narrative": "queued", "response": "queued"}, kinds


def test_a_streams_redis_client_is_closed_even_while_its_stream_is_cancelled(redis_url: str) -> None:
    """A stream whose HTTP client leaves is cancelled wherever it waits (here: not in a Redis
    read, as while it reads SQL); its async client's connections are still closed then, not left
    to the garbage collector, which may run after their loop has closed (a ResourceWarning)."""
    async def go() -> None:
        r = async_from_url(redis_url, False, socket_timeout=5, socket_connect_timeout=5)
        await r.ping()  # a connection open, idle in the pool
        conns = list(r.connection_pool._available_connections)  # type: ignore[union-attr]
        with anyio.CancelScope() as scope:
            scope.cancel()
            try:
                await anyio.sleep(60)  # cancelled at once
            finally:
                await close_fully(r)
        assert conns and not any(c.is_connected for c in conns)
    anyio.run(go)


def _until(cond: Callable[[], bool], what: str) -> None:
    """Wait for a state, not a moment: up to 60 s, however busy the machine."""
    end = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(0.05)
