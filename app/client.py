"""A Python client for the setflow API: `AsyncClient` (httpx, with a client-side rate limit by
asyncio-throttle and server-sent events as an async iterator) and `Client`, its synchronous
twin for scripts and notebooks.

    async with AsyncClient("http://127.0.0.1:8000", api_key="...") as c:
        job = await c.create_job("narrative", {"payload": {...}})
        async for event in c.events(job["id"]):
            ...                                   # status, step, progress, then result
        done = await c.wait(job["id"])

    with Client("http://127.0.0.1:8000", api_key="...") as c:
        sid = c.create_session()["id"]
        print(c.wait(c.turn(sid, text="...")["id"])["result"]["text"])
        # an agent whose metric tool runs here, on the client's own data
        job = c.create_job("agent", {"question": "...", "client_tools": ["metric"]})
        done = c.wait(job["id"], tools={"metric": lambda metric, region, period: my_lookup(...)})

Errors come back as ApiError with the API's stable code; a 429 is retried after its
Retry-After (up to `retries` times) before it is raised.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import re
import threading
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from contextlib import aclosing
from decimal import Decimal
from typing import Any, TypeVar, cast

import httpx
from asyncio_throttle import Throttler  # type: ignore[attr-defined]

from domain.grammar import number_text
from domain.tools import RESULT_RE, error_result

T = TypeVar("T")
TERMINAL = ("succeeded", "failed", "cancelled")
#: tool name -> the function the client runs for it (the call's arguments by name -> the output)
Tools = dict[str, Callable[..., Any]]


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.retry_after_s = status, code, message, retry_after_s


class AsyncClient:
    def __init__(self, base_url: str, api_key: str, rate_per_s: float = 20.0, retries: int = 3,
                 timeout_s: float = 30.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        """rate_per_s: requests this client sends per second at most (its own throttle, below
        the server's per-tenant limit); retries: how often a 429 is retried after Retry-After."""
        self.http = httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"},
                                      timeout=timeout_s, transport=transport)
        self.throttle = Throttler(rate_limit=max(1, int(rate_per_s)), period=max(1, int(rate_per_s)) / rate_per_s)
        self.retries = retries

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None,
                      idempotency_key: str | None = None) -> Any:
        """The answer's JSON (ApiError for a 4xx or 5xx); a 429 retried after its Retry-After.  With
        an idempotency_key, a request whose answer was lost (a timeout, a dropped connection) is
        sent again too: the API answers a retry with the first answer, so it makes nothing twice."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        for attempt in range(self.retries + 1):
            try:
                async with self.throttle:
                    r = await self.http.request(method, path, json=body, params=params, headers=headers)
            except httpx.TransportError:
                if idempotency_key is None or attempt == self.retries:
                    raise
                await asyncio.sleep(min(2.0 ** attempt, 10.0))
                continue
            if r.status_code == 429 and attempt < self.retries:
                await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                continue
            return _result(r)
        raise AssertionError("unreachable")

    # ---- sessions ---------------------------------------------------------------------------

    async def create_session(self) -> dict[str, Any]:
        return await self.request("POST", "/v1/sessions")  # type: ignore[no-any-return]

    async def get_session(self, session: str) -> dict[str, Any]:
        return await self.request("GET", f"/v1/sessions/{session}")  # type: ignore[no-any-return]

    async def turn(self, session: str, text: str | None = None, input_ids: list[int] | None = None,
                   params: dict[str, Any] | None = None, priority: str = "interactive") -> dict[str, Any]:
        """Queue a turn; returns the job (wait for it, or follow its events)."""
        body: dict[str, Any] = {"priority": priority, **({"params": params} if params else {})}
        body.update({"text": text} if input_ids is None else {"input_ids": input_ids})
        return await self.request("POST", f"/v1/sessions/{session}/turns", body)  # type: ignore[no-any-return]

    async def infill(self, session: str, text: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        body = {"text": text, **({"params": params} if params else {})}
        return await self.request("POST", f"/v1/sessions/{session}/infill", body)  # type: ignore[no-any-return]

    async def fork(self, session: str, turn: int) -> dict[str, Any]:
        return await self.request("POST", f"/v1/sessions/{session}/fork", {"turn": turn})  # type: ignore[no-any-return]

    async def delete_session(self, session: str) -> None:
        await self.request("DELETE", f"/v1/sessions/{session}")

    # ---- datasets (the agent's metric tool reads the tenant's own) ----------------------------

    async def put_dataset(self, name: str, rows: list[dict[str, str]] | None = None, csv: str | None = None
                          ) -> dict[str, Any]:
        """Create or replace a dataset: rows of {"metric", "region", "period", "value"}, or CSV text."""
        if (rows is None) == (csv is None):
            raise ValueError("give rows or csv")
        async with self.throttle:
            r = await (self.http.put(f"/v1/datasets/{name}", json={"rows": rows}) if csv is None else
                       self.http.put(f"/v1/datasets/{name}", content=csv, headers={"Content-Type": "text/csv"}))
        return _result(r)  # type: ignore[no-any-return]

    async def list_datasets(self) -> list[dict[str, Any]]:
        return (await self.request("GET", "/v1/datasets"))["datasets"]  # type: ignore[no-any-return]

    async def get_dataset(self, name: str) -> dict[str, Any]:
        return await self.request("GET", f"/v1/datasets/{name}")  # type: ignore[no-any-return]

    async def delete_dataset(self, name: str) -> None:
        await self.request("DELETE", f"/v1/datasets/{name}")

    # ---- jobs -------------------------------------------------------------------------------

    async def create_job(self, kind: str, spec: dict[str, Any], session: str | None = None,
                         priority: str = "interactive", idempotency_key: str | None = None) -> dict[str, Any]:
        """idempotency_key: a retry-safe submit (docs/api.md "Idempotent submits"): the same key
        and spec give the one job, however often it is sent."""
        body = {"kind": kind, "spec": spec, "priority": priority, **({"session": session} if session else {})}
        return await self.request("POST", "/v1/jobs", body, idempotency_key=idempotency_key)  # type: ignore[no-any-return]

    async def get_job(self, job: str) -> dict[str, Any]:
        return await self.request("GET", f"/v1/jobs/{job}")  # type: ignore[no-any-return]

    async def list_jobs(self, **filters: Any) -> list[dict[str, Any]]:
        out = await self.request("GET", "/v1/jobs", params={k: v for k, v in filters.items() if v is not None})
        return out["jobs"]  # type: ignore[no-any-return]

    async def cancel(self, job: str) -> dict[str, Any]:
        return await self.request("POST", f"/v1/jobs/{job}/cancel")  # type: ignore[no-any-return]

    async def events(self, job: str, after: str | None = None, reconnect_s: float = 120.0
                     ) -> AsyncGenerator[dict[str, Any], None]:
        """The job's events as dicts with "event" (status, step, progress, result) and "id";
        ends after the result.  A dropped connection, an API restarting (503, refused
        connections) or a stream limit (429) is retried after the last event seen, for up to
        reconnect_s without an event; other errors raise ApiError."""
        last, quiet_since = after, time.monotonic()
        while True:
            headers = {"Last-Event-ID": last} if last else {}
            async with self.throttle:  # a (re)connection counts as a request
                pass
            try:
                async with self.http.stream("GET", f"/v1/jobs/{job}/events", headers=headers,
                                            timeout=httpx.Timeout(30.0, read=60.0)) as r:
                    if r.status_code != 200:
                        await r.aread()
                        _result(r)
                    event, data, eid = "message", "", None
                    async with aclosing(cast(AsyncGenerator[str, None], r.aiter_lines())) as lines:
                        async for line in lines:
                            if line.startswith("event: "):
                                event = line[7:]
                            elif line.startswith("data: "):
                                data += line[6:]
                            elif line.startswith("id: "):
                                eid = line[4:]
                            elif line == "" and data:
                                out = {"event": event, "id": eid, **json.loads(data)}
                                last, quiet_since = eid or last, time.monotonic()
                                yield out
                                if event == "result":
                                    return
                                event, data, eid = "message", "", None
            except (httpx.TransportError, ApiError) as e:
                if isinstance(e, ApiError) and e.status not in (429, 502, 503, 504):
                    raise
                if time.monotonic() - quiet_since > reconnect_s:
                    raise
                wait = e.retry_after_s if isinstance(e, ApiError) and e.retry_after_s else 0.5
                await asyncio.sleep(min(wait, 5.0))  # then reconnect after the last event seen

    async def tool_outputs(self, job: str, outputs: dict[str, str]) -> dict[str, Any]:
        """Answer calls the waiting job made to tools its client runs: call id -> output (a
        number as the tools write it, or "error: <reason>"); returns the job (queued again
        once every pending call has its output)."""
        body = {"tool_outputs": [{"call_id": k, "output": v} for k, v in outputs.items()]}
        return await self.request("POST", f"/v1/jobs/{job}/tool_outputs", body)  # type: ignore[no-any-return]

    async def wait(self, job: str, timeout_s: float = 600.0, tools: Tools | None = None) -> dict[str, Any]:
        """The job once it finished (its events, then GET); or, without `tools`, once it waits
        for tool outputs (status requires_action: its `required_action` names the calls).
        tools: tool name -> a function of the call's arguments (by name) returning its output,
        or raising (its message goes back as "error: ...", as the API takes it: `<`, `>` and
        control characters made spaces, cut at 200 characters); a coroutine function is awaited.
        Each call the job waits for is answered so, and the job followed to its end."""
        async def follow() -> dict[str, Any]:
            async with aclosing(self.events(job)) as events:
                async for ev in events:
                    if ev["event"] == "result":
                        return {k: v for k, v in ev.items() if k not in ("event", "id")}
                    if ev["event"] == "status" and ev.get("status") == "requires_action":
                        waiting = await self.get_job(job)
                        if waiting["status"] != "requires_action":
                            continue  # answered already (by another client): it runs on
                        if tools is None:
                            return waiting
                        await self._answer(waiting, tools)
            return await self.get_job(job)
        return await asyncio.wait_for(follow(), timeout_s)

    async def _answer(self, job: dict[str, Any], tools: Tools) -> None:
        outputs = {}
        for call in job["required_action"]["calls"]:
            fn = tools.get(call["tool"])
            try:
                if fn is None:
                    raise LookupError(f"this client runs no tool {call['tool']!r}")
                out = fn(**call["arguments"])
                out = await out if inspect.isawaitable(out) else out
                out = tool_output(out)
            except Exception as e:  # noqa: BLE001 - the tool's failure is the model's result, as a server tool's
                out = error_result(str(e) or type(e).__name__)  # as the API takes it: no '<', cut at 200
            outputs[call["id"]] = out
        try:
            await self.tool_outputs(job["id"], outputs)
        except ApiError as e:
            if e.code not in ("already_answered", "not_waiting"):  # another client answered first
                raise


def tool_output(out: object) -> str:
    """What a client's tool returned, as the API takes an output (RESULT_RE), else ValueError
    (the tool's failure: its job reads "error: ...", and goes on, rather than waits for an
    output the API refused): a number (int, float, Decimal) as a payload's is read (0.1 + 0.2
    is "0.3"; 1e-7, with its 7 decimals, is refused), a string as it is, stripped."""
    if isinstance(out, (int, float, Decimal)) and not isinstance(out, bool):
        return number_text(str(out) if isinstance(out, Decimal) else out)
    if not isinstance(out, str) or not re.fullmatch(RESULT_RE, out.strip()):
        raise ValueError(f"the tool returned {str(out)[:60]!r}, which is no number as a result is written, like -1240.5")
    return out.strip()


class Client:
    """The synchronous client: the async one on an event loop of its own (a thread)."""

    def __init__(self, base_url: str, api_key: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="setflow-client", daemon=True)
        self._thread.start()
        self._async = self._run(_make(base_url, api_key, kwargs))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._async.close())
            self._run(self._loop.shutdown_asyncgens())  # any event stream left open
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()

    def __getattr__(self, name: str) -> Any:
        """Every AsyncClient method, synchronously (events: a plain iterator)."""
        fn = getattr(self._async, name)
        if name == "events":
            return lambda *a, **k: self._iterate(fn(*a, **k))
        if not callable(fn):
            return fn
        return lambda *a, **k: self._run(fn(*a, **k))

    def _iterate(self, agen: AsyncGenerator[dict[str, Any], None]) -> Iterator[dict[str, Any]]:
        async def step() -> dict[str, Any]:
            return await agen.__anext__()

        try:
            while True:
                fut = asyncio.run_coroutine_threadsafe(step(), self._loop)
                try:
                    yield fut.result()
                except StopAsyncIteration:
                    return
                except BaseException:  # Ctrl-C (or a timeout) here: stop the step on its loop first
                    fut.cancel()
                    concurrent.futures.wait([fut], timeout=5)
                    raise
        finally:  # the caller stopped early (or the stream ended): close it on its own loop
            try:
                self._run(agen.aclose())
            except RuntimeError:
                pass  # still running (a step that would not stop): the loop's shutdown closes it


async def _make(base_url: str, api_key: str, kwargs: dict[str, Any]) -> AsyncClient:
    return AsyncClient(base_url, api_key, **kwargs)  # built on the loop that will use it


def _result(r: httpx.Response) -> Any:
    if r.status_code == 204:
        return None
    try:
        body = r.json()
    except ValueError:
        body = None
    if r.is_success:
        return body
    err = body.get("error", {}) if isinstance(body, dict) else {}
    retry = r.headers.get("retry-after")
    raise ApiError(r.status_code, err.get("code", "http_error"), err.get("message", r.text[:200]),
                   float(retry) if retry else None)
