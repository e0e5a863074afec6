"""A tenant's turns in the API process (runtime/api/gate.py Turns): at most tenant_max_inflight
of its requests run at once, the rest wait in order, and beyond 16 waiting per turn it gets 429;
another tenant's request never waits behind them.  The order is pure logic, shown on a tiny ASGI
app whose requests end when the test says; then on the real app, a response awaited (POST
/v1/responses without background) gives its turn back while it waits."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from runtime.api.auth import KeyRing
from runtime.api.gate import WAITING_PER_TURN, Turns
from runtime.api.scope import release_turn
from tests.runtime.api.conftest import ACME, Api

KEYS = {"key-acme-0001": "acme", "key-globex-01": "globex"}


class Held:
    """An ASGI app whose request to /v1/hold/<n> answers once the test sets gate n (and says
    when it started); /v1/stream answers at once with a body that ends when the test says;
    /v1/wait gives its turn back, then waits for its gate."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.started: list[str] = []

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = scope["path"].rsplit("/", 1)[1]
        self.started.append(name)
        if scope["path"].startswith("/v1/wait/"):
            release_turn(scope)
        if not scope["path"].startswith("/v1/stream/"):
            await self.gate(name).wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if scope["path"].startswith("/v1/stream/"):
            await self.gate(name).wait()  # the body goes on after the start: no turn held
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})


def call(app: Turns, path: str, key: str, out: dict[str, int], method: str = "GET") -> asyncio.Task[None]:
    """The request as a task; its status lands in out[path]."""
    scope = {"type": "http", "method": method, "path": path, "headers": [(b"authorization", f"Bearer {key}".encode())],
             "app": SimpleNamespace(state=SimpleNamespace(services=SimpleNamespace(keyring=KeyRing(KEYS))))}

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            out[path] = message["status"]

    return asyncio.ensure_future(app(scope, receive, send))


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_tenant_runs_at_most_its_turns_and_another_tenant_does_not_wait() -> None:
    async def scenario() -> None:
        held, out = Held(), {}
        app = Turns(held, inflight=2)
        first = [call(app, f"/v1/hold/a{i}", "key-acme-0001", out) for i in range(4)]
        await settle()
        assert held.started == ["a0", "a1"]  # two turns: a2 and a3 wait, in order
        other = call(app, "/v1/hold/g0", "key-globex-01", out)
        await settle()
        assert held.started == ["a0", "a1", "g0"]  # globex's request does not wait behind acme's
        held.gate("a1").set()
        await settle()
        assert held.started == ["a0", "a1", "g0", "a2"] and out["/v1/hold/a1"] == 200
        for g in ("a0", "a2", "a3", "g0"):
            held.gate(g).set()
        await asyncio.gather(*first, other)
        assert held.started == ["a0", "a1", "g0", "a2", "a3"] and set(out.values()) == {200}
        assert app.waiting == {"acme": 0, "globex": 0}
    asyncio.run(scenario())


def test_past_its_waiting_bound_a_tenant_gets_429() -> None:
    async def scenario() -> None:
        held, out = Held(), {}
        app = Turns(held, inflight=1)
        tasks = [call(app, f"/v1/hold/a{i}", "key-acme-0001", out) for i in range(1 + WAITING_PER_TURN + 1)]
        await settle()
        last = f"/v1/hold/a{WAITING_PER_TURN + 1}"
        assert out == {last: 429}  # one running, 16 waiting: the 18th is refused at once
        assert len(held.started) == 1
        for i in range(WAITING_PER_TURN + 1):
            held.gate(f"a{i}").set()
        await asyncio.gather(*tasks)
        assert len(held.started) == 1 + WAITING_PER_TURN and list(out.values()).count(200) == 1 + WAITING_PER_TURN
    asyncio.run(scenario())


def test_a_stream_holds_no_turn_once_it_started_nor_a_route_that_gave_it_back() -> None:
    async def scenario() -> None:
        held, out = Held(), {}
        app = Turns(held, inflight=1)
        stream = call(app, "/v1/stream/s", "key-acme-0001", out)
        await settle()
        assert out == {"/v1/stream/s": 200}  # started; its body still going
        waiting = call(app, "/v1/wait/w", "key-acme-0001", out)
        await settle()
        after = call(app, "/v1/hold/h", "key-acme-0001", out)
        await settle()
        assert held.started == ["s", "w", "h"]  # neither the stream nor the waiting route holds the turn
        for g in ("s", "w", "h"):
            held.gate(g).set()
        await asyncio.gather(stream, waiting, after)
    asyncio.run(scenario())


def test_requests_without_a_valid_key_pass() -> None:
    async def scenario() -> None:
        held, out = Held(), {}
        app = Turns(held, inflight=1)
        tasks = [call(app, f"/v1/hold/x{i}", "not-a-key-000", out) for i in range(3)]
        await settle()
        assert held.started == ["x0", "x1", "x2"] and app.turns == {}  # the app answers them (401): no turn
        for i in range(3):
            held.gate(f"x{i}").set()
        await asyncio.gather(*tasks)
    asyncio.run(scenario())


def test_an_awaited_response_gives_its_turn_back(make_api: Any) -> None:
    """On the real app with one turn: while a POST /v1/responses waits for its (never started:
    no worker) job, the same tenant's reads and submissions still answer."""
    api: Api = make_api(tenant_max_inflight=1, response_wait_s=3.0)
    body = {"model": "setflow-tiny", "input": "hello"}
    cards = api.http.get("/v1/models", headers=ACME).json()["data"]
    body["model"] = cards[0]["id"]

    async def scenario() -> list[int]:
        import httpx
        transport = httpx.ASGITransport(app=api.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=ACME, timeout=30) as c:
            waiting = asyncio.ensure_future(c.post("/v1/responses", content=json.dumps(body),
                                                   headers={"Content-Type": "application/json"}))
            await asyncio.sleep(0.5)
            assert not waiting.done()  # it waits (up to response_wait_s)
            reads = [(await c.get("/v1/jobs")).status_code for _ in range(3)]
            assert not waiting.done()  # the reads answered while it still waited: it holds no turn
            return [*reads, (await waiting).status_code]
    assert asyncio.run(scenario()) == [200, 200, 200, 200]
