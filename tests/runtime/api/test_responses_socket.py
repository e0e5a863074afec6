"""WebSocket mode on /v1/responses driven by the official `openai` SDK (`responses.connect()`)
against real worker processes, a real Redis and SQLite (test_responses.py's stack): a chain of
20 client tool calls (10 questions, two lookups each) whose socket is dropped twice, once
between responses with the worker that holds the session killed (-9), once in the middle of a
response, and resumed each time on a new socket from previous_response_id, ends token for token
as the same chain over one unbroken socket and over HTTP; the upgrade itself, refused and
accepted, as uvicorn answers it; frames sent while a response runs wait their turn, four at most;
a store-false chain goes on on its own socket only, as the Open Responses spec's WebSocket mode
has it (its latest response kept there, evicted by a refused continuation, not found on another
socket, forgotten once the socket closes)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
import websockets
from websockets.sync.client import connect

from app.demo import Stack
from tests.runtime.api import test_responses as base
from tests.runtime.api.test_responses import KEY, LOOKUP, OUTPUTS, kill, restart, sdk, session_tokens
from tests.workflows.test_agent import ANSWER, QUESTION

pytestmark = pytest.mark.slow
stack = base.stack  # test_responses.py's stack (its own, for this module)
QUESTIONS = 10  # each asks for two lookups: 20 tool calls
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "response.cancelled", "error")


class Chain:
    """The tool loop: QUESTION asked QUESTIONS times in one chain (previous_response_id), each
    call answered from OUTPUTS; over HTTP, or over a socket that `breaks` may drop after a
    response (its number, from 1 -> what to do before the next socket opens), or in the middle
    of one (`mid`: dropped once its response.created has come)."""

    def __init__(self, c: openai.OpenAI, socket: bool, breaks: dict[int, Callable[[Any], None]] | None = None,
                 mid: int | None = None) -> None:
        self.c, self.socket, self.breaks, self.mid = c, socket, breaks or {}, mid
        self.conn: Any = None
        self.sockets = 0
        self.responses: list[Any] = []

    def run(self) -> list[Any]:
        inp: Any = QUESTION
        asked = 1
        try:
            while True:
                kw = {"model": "small", "input": inp, "tools": [LOOKUP]}
                if self.responses:
                    kw["previous_response_id"] = self.responses[-1].id
                r = self._over_socket(kw) if self.socket else self.c.responses.create(**kw)
                assert r.status == "completed", (r.status, r.error)
                self.responses.append(r)
                if (then := self.breaks.get(len(self.responses))) is not None:
                    self._close()
                    then(r)
                if r.output[0].type == "function_call":
                    call = r.output[0]
                    inp = [{"type": "function_call_output", "call_id": call.call_id,
                            "output": OUTPUTS[json.loads(call.arguments)["quarter"]]}]
                elif asked < QUESTIONS:
                    inp, asked = QUESTION, asked + 1
                else:
                    return self.responses
        finally:
            self._close()

    def _over_socket(self, kw: dict[str, Any]) -> Any:
        if self.conn is None:
            self.conn, self.sockets = self.c.responses.connect().enter(), self.sockets + 1
        self.conn.response.create(**kw)
        seqs = []
        for ev in self.conn:
            seqs.append(ev.sequence_number)
            if ev.type == "response.created" and len(self.responses) + 1 == self.mid:
                self._close()  # gone mid-response: it runs to its end all the same (store true)
                return self._ended(ev.response.id)
            if ev.type in TERMINAL:
                assert ev.type != "error", ev
                assert seqs == list(range(len(seqs)))  # numbered as its SSE stream is
                return ev.response
        raise AssertionError("the socket closed before the response ended")

    def _ended(self, rid: str) -> Any:
        deadline = time.monotonic() + 60
        while (r := self.c.responses.retrieve(rid)).status in ("queued", "in_progress"):
            assert time.monotonic() < deadline, r.status
            time.sleep(0.05)
        return r

    def _close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def said(responses: list[Any]) -> list[Any]:
    """What each response said: its calls' arguments, or its answer."""
    return [r.output[0].arguments if r.output[0].type == "function_call" else r.output_text for r in responses]


def test_a_20_call_chain_resumes_on_new_sockets_after_a_drop_a_kill_and_a_drop_mid_response(stack: Stack) -> None:
    c = sdk(stack)
    http = Chain(c, socket=False).run()
    unbroken = Chain(c, socket=True)
    unbroken.run()
    assert sum(r.output[0].type == "function_call" for r in http) == 2 * QUESTIONS
    assert ANSWER in http[2].output_text and len(http) == 3 * QUESTIONS
    assert said(unbroken.responses) == said(http) and unbroken.sockets == 1

    killed: list[str] = []

    def drop_and_kill(r: Any) -> None:  # the worker that ran the last response, and holds the session warm
        killed.append(c.get(f"/jobs/{r.model_extra['setflow']['job']}", cast_to=httpx.Response).json()["last_worker"])
        kill(stack, killed[-1])

    broken = Chain(c, socket=True, breaks={7: drop_and_kill, 16: lambda r: None}, mid=23)
    try:
        broken.run()
    finally:
        for w in killed:
            restart(stack, w)
    assert broken.sockets == 4 and len(killed) == 1
    assert said(broken.responses) == said(http)
    sessions = {r.model_extra["setflow"]["session"] for r in broken.responses}
    assert len(sessions) == 1  # one chain, one session: each response went on in it
    after_kill = broken.responses[7]
    assert after_kill.usage is not None and after_kill.usage.input_tokens_details.cached_tokens > 0
    # not warm anywhere: the other worker loaded the session, from Redis or from SQL as its cost
    # model chose (rates it measured at start, so the choice varies with the machine's load)
    assert after_kill.model_extra["setflow"]["turns"][0]["path"] in ("restore", "recompute")
    ref, *others = [session_tokens(stack, chain[0].model_extra["setflow"]["session"])
                    for chain in (http, unbroken.responses, broken.responses)]
    assert ref and all(t == ref for t in others)  # the sessions' tokens, every turn's: the same


def test_the_upgrade_refused_and_accepted_as_uvicorn_answers_it(stack: Stack) -> None:
    url = stack.api.url.replace("http://", "ws://") + "/v1/responses"
    with pytest.raises(websockets.InvalidStatus) as e:
        connect(url, additional_headers={"Authorization": "Bearer sk-nobody"}).close()
    assert e.value.response.status_code == 401
    assert json.loads(e.value.response.body)["error"]["type"] == "authentication_error"
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(json.dumps({"type": "response.create", "input": "x" * stack.s.max_body_bytes}))  # past it: an error
        ev = json.loads(ws.recv(timeout=30))
        assert ev["type"] == "error" and ev["error"]["code"] == "too_large"
        ws.send(json.dumps({"type": "response.create", "model": "small", "input": "Revenue rose in EMEA",
                            "max_output_tokens": 4}))
        types: list[str] = []
        while not types or types[-1] not in TERMINAL:
            types.append(json.loads(ws.recv(timeout=60))["type"])
        assert types[0] == "response.created" and types[-1] in ("response.completed", "response.incomplete")
        ws.send("x" * (stack.s.max_body_bytes + 8192))  # past uvicorn's ceiling: not read, the socket closed
        with pytest.raises(websockets.ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def test_frames_sent_while_a_response_runs_wait_in_order_four_at_most(stack: Stack) -> None:
    url = stack.api.url.replace("http://", "ws://") + "/v1/responses"
    long = {"type": "response.create", "model": "small", "input": "Revenue rose in EMEA", "max_output_tokens": 48,
            "setflow": {"policy": "ar", "window": 1, "tau": None, "ignore_eos": True}}
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(json.dumps(long))
        assert json.loads(ws.recv(timeout=30))["type"] == "response.created"
        for i in range(6):  # while it runs: four wait their turn, two are refused
            ws.send(json.dumps({"type": f"not.an.event.{i}", "stream_id": f"lane-{i}"}))
        evs = []
        while len([e for e in evs if e["type"] == "error"]) < 6:
            evs.append(json.loads(ws.recv(timeout=60)))
    ended = next(i for i, e in enumerate(evs) if e["type"] in TERMINAL)
    assert evs[ended]["type"] == "response.incomplete" and all(e["type"] != "error" for e in evs[:ended])
    errs = evs[ended + 1:]
    assert [e["error"]["code"] for e in errs] == ["rate_limited"] * 2 + ["bad_input"] * 4
    assert [e["stream_id"] for e in errs[2:]] == [f"lane-{i}" for i in range(4)]  # the four that waited, in order


def _turn(ws: Any, **body: Any) -> dict[str, Any]:
    """One response.create frame (the compliance suite's shape): its terminal event or its error."""
    ws.send(json.dumps({"type": "response.create", "model": "small", "max_output_tokens": 8, **body}))
    while (ev := json.loads(ws.recv(timeout=60)))["type"] not in TERMINAL:
        pass
    return dict(ev)


def test_a_store_false_chain_goes_on_on_its_own_socket_only_and_is_forgotten_after(stack: Stack) -> None:
    """The Open Responses suite's websocket-continuation, -failed-continuation-evicts-cache and
    -reconnect-store-false-recovery.  Before: a store-false response was deleted as its stream
    ended, so the same socket could not go on from it (not_found), and another socket got
    not_found, not previous_response_not_found."""
    url = stack.api.url.replace("http://", "ws://") + "/v1/responses"
    auth = {"Authorization": f"Bearer {KEY}"}
    done = ("response.completed", "response.incomplete")
    with connect(url, additional_headers=auth) as ws:
        first = _turn(ws, store=False, input="Remember the code word: cobalt. Reply with OK.")
        assert first["type"] in done, first
        r1 = first["response"]["id"]
        second = _turn(ws, store=False, previous_response_id=r1, input="What is the code word?")
        assert second["type"] in done and second["response"]["previous_response_id"] == r1, second
        r2 = second["response"]["id"]
        stale = _turn(ws, store=False, previous_response_id=r1, input="Again?")  # the socket keeps its latest only
        assert stale["type"] == "error" and stale["error"]["code"] == "previous_response_not_found", stale
        refused = _turn(ws, store=False, previous_response_id=r2, input=[
            {"type": "function_call_output", "call_id": "call_openresponses_missing", "output": "no such call"}])
        assert refused["type"] == "error" and refused["status"] == 400, refused
        evicted = _turn(ws, store=False, previous_response_id=r2, input="Go on.")
        assert evicted["type"] == "error" and evicted["error"]["code"] == "previous_response_not_found", evicted
        third = _turn(ws, store=False, input="Remember the code word: ember. Reply with OK.")
        assert third["type"] in done, third
        r3 = third["response"]["id"]
    with connect(url, additional_headers=auth) as ws:
        again = _turn(ws, store=False, previous_response_id=r3, input="Reply with exactly: reconnected")
        assert again["type"] == "error" and again["error"]["code"] == "previous_response_not_found", again
        recovered = _turn(ws, store=False, input="Start a new response and reply with exactly: recovered")
        assert recovered["type"] in done and recovered["response"]["previous_response_id"] is None, recovered
        r4 = recovered["response"]["id"]
    c = sdk(stack)
    deadline = time.monotonic() + 30
    for rid in (r1, r2, r3, r4):  # nothing of them stays once their socket has closed
        while True:
            try:
                c.responses.retrieve(rid)
            except openai.NotFoundError:
                break
            assert time.monotonic() < deadline, f"{rid} (store false) is still there"
            time.sleep(0.1)
