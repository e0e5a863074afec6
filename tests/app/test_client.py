"""app/client.py against the app (in process, over httpx's ASGI transport; no worker): its
errors carry the API's codes, a 429 is retried after Retry-After, and the sync twin runs the
same calls on a loop of its own."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from app.client import ApiError, AsyncClient, Client
from tests.runtime.api.conftest import NARRATIVE, Api


def test_errors_come_back_with_their_stable_codes(api: Api) -> None:
    async def go() -> None:
        async with AsyncClient("http://api", "key-acme-0001", transport=httpx.ASGITransport(app=api.app)) as c:
            sid = (await c.create_session())["id"]
            with pytest.raises(ApiError) as e:
                await c.fork(sid, 0)  # no turn yet
            assert (e.value.status, e.value.code) == (422, "bad_input") and "turn must be in" in e.value.message
            with pytest.raises(ApiError) as e:
                await c.get_job("0" * 24)
            assert (e.value.status, e.value.code) == (404, "not_found")
            job = await c.create_job("narrative", NARRATIVE, session=sid)
            assert job["status"] == "queued" and job["session"] == sid
            assert [j["id"] for j in await c.list_jobs(session=sid)] == [job["id"]]
            assert (await c.cancel(job["id"]))["status"] == "cancelled"
        async with AsyncClient("http://api", "not-a-key-at-all", transport=httpx.ASGITransport(app=api.app)) as c:
            with pytest.raises(ApiError) as e:
                await c.create_session()
            assert (e.value.status, e.value.code) == (401, "unauthorized")
    asyncio.run(go())


def test_a_rate_limited_request_is_retried_after_retry_after(make_api: Callable[..., Api]) -> None:
    api = make_api(tenant_burst=1, tenant_rate_per_s=2.0)  # one token, the next in 0.5 s

    async def go(retries: int) -> list[str]:
        transport = httpx.ASGITransport(app=api.app)
        async with AsyncClient("http://api", "key-acme-0001", transport=transport, retries=retries) as c:
            return [(await c.create_session())["id"] for _ in range(2)]
    assert len(set(asyncio.run(go(retries=1)))) == 2  # the second waited Retry-After (1 s), then passed
    with pytest.raises(ApiError) as e:
        asyncio.run(go(retries=0))
    assert e.value.code == "rate_limited" and e.value.retry_after_s is not None and e.value.retry_after_s >= 1


def test_the_sync_client_runs_on_its_own_loop_and_closes_it(api: Api) -> None:
    before = threading.active_count()
    c = Client("http://api", "key-acme-0001", transport=httpx.ASGITransport(app=api.app))
    sid = c.create_session()["id"]
    assert c.get_session(sid)["turns"] == []
    c.close()
    assert c._loop.is_closed() and not c._thread.is_alive()
    for _ in range(100):  # the worker thread that ran the sync routes on its loop ends by itself
        if threading.active_count() <= before:
            break
        time.sleep(0.05)
    assert threading.active_count() <= before


def test_event_streams_work_from_several_event_loops(api: Api) -> None:
    """The app's async Redis client belongs to one loop: each loop gets its own."""
    job = api.http.post("/v1/jobs", headers={"Authorization": "Bearer key-acme-0001"},
                        json={"kind": "narrative", "spec": NARRATIVE}).json()
    api.http.post(f"/v1/jobs/{job['id']}/cancel", headers={"Authorization": "Bearer key-acme-0001"})
    with Client("http://api", "key-acme-0001", transport=httpx.ASGITransport(app=api.app)) as c:
        assert [e["event"] for e in c.events(job["id"])][-1] == "result"  # on the client's own loop
    r = api.http.get(f"/v1/jobs/{job['id']}/events", headers={"Authorization": "Bearer key-acme-0001"})
    assert r.status_code == 200 and "event: result" in r.text  # on the TestClient's loop
    assert asyncio.run(_events(api, job["id"]))[-1] == "result"  # and on a third


async def _events(api: Api, job: str) -> list[str]:
    async with AsyncClient("http://api", "key-acme-0001", transport=httpx.ASGITransport(app=api.app)) as c:
        return [e["event"] async for e in c.events(job)]


class _AnswerLost(httpx.AsyncBaseTransport):
    """The API's transport, whose first answer to a POST is lost after the API made it (a
    timeout on the way back): what a retry-safe submit is for."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner, self.lost = inner, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        r = await self.inner.handle_async_request(request)
        if request.method == "POST" and not self.lost:
            self.lost += 1
            await r.aread()
            raise httpx.ReadTimeout("the answer was lost", request=request)
        return r


def test_a_submit_with_an_idempotency_key_is_retried_when_its_answer_is_lost_and_makes_one_job(api: Api) -> None:
    async def go(key: str | None) -> list[str]:
        async with AsyncClient("http://api", "key-acme-0001", transport=_AnswerLost(httpx.ASGITransport(app=api.app))) as c:
            try:
                await c.create_job("narrative", NARRATIVE, idempotency_key=key)
            finally:
                jobs = [j["id"] for j in await c.list_jobs()]
            return jobs
    assert len(asyncio.run(go("submit-0001"))) == 1  # sent twice, one job: the retry got the first answer
    with pytest.raises(httpx.ReadTimeout):  # no key: not retried (a retry could make a second job)
        asyncio.run(go(None))
