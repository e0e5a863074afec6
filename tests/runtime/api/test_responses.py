"""The Responses API driven by the official `openai` SDK over HTTP, against real worker processes,
a real Redis and SQLite (app.demo.Stack): create, stream, background, poll and cancel; a
function-calling loop over previous_response_id with a worker killed (-9) while the call waits,
ending token for token as the uninterrupted loop; conversations, with items added, and a branch
from an earlier response; a stream resumed with starting_after after a kill -9 and after an API
restart, no event lost or doubled; store false keeps nothing; bad input gets OpenAI's errors and
changes nothing."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from app.demo import Stack
from app.serve import ApiServer
from runtime.db import make_engine
from runtime.sessions.records import Records
from runtime.settings import Settings
from tests.receiver import receiver
from tests.runtime.api.conftest import delete_keys
from tests.workflows.test_agent import ANSWER, QUESTION, V1, V2

pytestmark = pytest.mark.slow
KEY, OTHER = "sk-resp-acme-0001", "sk-resp-globex-01"
LOOKUP: dict[str, Any] = {"type": "function", "name": "get_kpi", "description": "a KPI's value in a market and quarter",
                          "parameters": {"type": "object", "required": ["kpi", "market", "quarter"],
                                         "properties": {"kpi": {"type": "string", "enum": ["revenue", "churn"]},
                                                        "market": {"type": "string", "enum": ["EMEA", "APAC"]},
                                                        "quarter": {"type": "string"}}}}
OUTPUTS = {"2026-Q2": V1, "2026-Q3": V2}  # the client's lookup: the sample dataset's values
#: a text response long enough to be caught mid-stream (AR: one token a step, to its limit)
LONG: dict[str, Any] = {"input": "Revenue rose in EMEA", "max_output_tokens": 400,
                        "extra_body": {"setflow": {"policy": "ar", "window": 1, "tau": None, "ignore_eos": True}}}


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prefix = f"sfresp-{uuid.uuid4().hex[:10]}"
    s = Settings(redis_url=redis_url, key_prefix=prefix, data_dir=tmp_path_factory.mktemp("responses"),
                 api_keys={KEY: "acme", OTHER: "globex"}, api_port=0, tenant_burst=1000, tenant_rate_per_s=1000.0,
                 job_lease_s=2.0, reaper_interval_s=0.5, worker_heartbeat_s=0.3, job_requeue_after_s=8.0,
                 webhook_allow_private=True)  # its webhook receiver listens on 127.0.0.1
    st = Stack(s, workers=2).start()
    try:
        yield st
    finally:
        for c in OPEN:
            c.close()
        OPEN.clear()
        st.stop()
        delete_keys(redis_url, f"{prefix}*")


OPEN: list[openai.OpenAI] = []  # the clients made: closed with the stack (no socket left to the GC)


def sdk(stack: Stack, key: str = KEY) -> openai.OpenAI:
    OPEN.append(openai.OpenAI(api_key=key, base_url=stack.api.url + "/v1", max_retries=0, timeout=120))
    return OPEN[-1]


def answer_calls(c: openai.OpenAI, r: Any, **kw: Any) -> list[Any]:
    """The function-calling loop: each call answered from OUTPUTS, until a message."""
    chain = [r]
    while r.output and r.output[0].type == "function_call":
        call = r.output[0]
        out = OUTPUTS[json.loads(call.arguments)["quarter"]]
        r = c.responses.create(model="small", previous_response_id=r.id, tools=[LOOKUP], **kw,
                               input=[{"type": "function_call_output", "call_id": call.call_id, "output": out}])
        chain.append(r)
    return chain


def session_tokens(stack: Stack, session: str) -> list[int]:
    return [t for turn in Records(make_engine(stack.s)).turns(session, "acme") for t in turn.token_ids]


def kill(stack: Stack, worker: str) -> None:
    p = stack.procs[stack.names.index(worker)]
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def restart(stack: Stack, worker: str) -> None:
    i = stack.names.index(worker)
    stack.procs.pop(i)
    stack.names.pop(i)
    stack.names.append(worker)
    stack._launch(worker)
    stack._wait_alive([worker], [stack.procs[-1]], 120)


def test_models_and_a_text_response_created_polled_and_listed(stack: Stack) -> None:
    c = sdk(stack)
    assert [m.id for m in c.models.list()] == ["small"]
    raw = c.responses.with_raw_response.create(model="small", input="Revenue rose in EMEA", max_output_tokens=8,
                                               metadata={"team": "growth"})
    assert raw.headers["x-ratelimit-limit-requests"] == "1000"  # the tenant's bucket, as OpenAI's headers say one
    assert 0 <= int(raw.headers["x-ratelimit-remaining-requests"]) <= 1000
    assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
    r = raw.parse()
    assert r.status in ("completed", "incomplete") and r.output_text and "[F" not in r.output_text
    assert r.usage is not None and r.usage.output_tokens <= 8 and r.metadata == {"team": "growth"}
    assert c.responses.retrieve(r.id).output_text == r.output_text
    [item] = c.responses.input_items.list(r.id).data
    assert item.type == "message" and item.content[0].text == "Revenue rose in EMEA"  # type: ignore[union-attr]
    # a model no worker hosts runs on the default, and the response names the one that ran (it echoed the request's)
    other = c.responses.create(model="gpt-4o", input="Revenue rose", max_output_tokens=2)
    assert other.model == c.responses.retrieve(other.id).model == "small"


def test_a_function_calling_loop_resumes_after_its_worker_is_killed_token_identical(stack: Stack) -> None:
    c = sdk(stack)
    reference = answer_calls(c, c.responses.create(model="small", input=QUESTION, tools=[LOOKUP]))
    assert ANSWER in reference[-1].output_text and reference[-1].model_extra["setflow"]["verified"] is True
    assert [r.model_extra["setflow"]["session"] for r in reference] == [reference[0].model_extra["setflow"]["session"]] * 3

    first = c.responses.create(model="small", input=QUESTION, tools=[LOOKUP])
    [call] = first.output
    assert call.type == "function_call" and json.loads(call.arguments) == {  # type: ignore[union-attr]
        "kpi": "revenue", "market": "EMEA", "quarter": "2026-Q2"}
    worker = c.get(f"/jobs/{first.model_extra['setflow']['job']}", cast_to=httpx.Response).json()["last_worker"]
    kill(stack, worker)  # the worker that holds the session warm dies while the call waits
    try:
        chain = answer_calls(c, first)
    finally:
        restart(stack, worker)
    assert [r.output_text for r in chain] == [r.output_text for r in reference]
    assert chain[-1].usage is not None and chain[-1].usage.input_tokens_details.cached_tokens > 0  # restored, not re-read
    assert session_tokens(stack, chain[-1].model_extra["setflow"]["session"]) == \
        session_tokens(stack, reference[-1].model_extra["setflow"]["session"])


def test_a_functions_output_with_a_newline_is_the_number_it_holds(stack: Stack) -> None:
    """A tool that prints its value ("8312\n") once failed unverified: the answer said 8312, the
    check compared it with the output as sent."""
    c = sdk(stack)
    r = c.responses.create(model="small", input=QUESTION, tools=[LOOKUP])
    while r.output and r.output[0].type == "function_call":
        call = r.output[0]
        out = OUTPUTS[json.loads(call.arguments)["quarter"]] + "\n"
        r = c.responses.create(model="small", previous_response_id=r.id, tools=[LOOKUP],
                               input=[{"type": "function_call_output", "call_id": call.call_id, "output": out}])
    assert ANSWER in r.output_text and r.model_extra["setflow"]["verified"] is True, r


#: the Open Responses suite's weather tool (function-call-roundtrip): one string, its output words
WEATHER: dict[str, Any] = {"type": "function", "name": "get_weather", "description": "Get the current weather for a location",
                           "parameters": {"type": "object", "required": ["location"], "properties": {
                               "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"}}}}


def test_a_weather_tools_words_come_back_quoted_in_a_verified_answer(stack: Stack) -> None:
    """The suite's round trip as it sends it: the call forced by tool_choice, its output words
    sent after the response by previous_response_id (no tools re-sent).  The call's location is
    the name the question writes; the answer quotes the output whole: completed and verified (it
    failed `unverified` before: nothing verified an answer from an output that is no number)."""
    c = sdk(stack)
    first = c.responses.create(model="small", input="Use the weather tool to get the temperature in San Francisco.",
                               tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"})
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.arguments) == {"location": "San Francisco"}  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError, match="at most 207 characters"):  # more than the model reads as one fact
        c.responses.create(model="small", previous_response_id=first.id, input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "64 degrees " * 30}])  # type: ignore[union-attr]
    second = c.responses.create(model="small", previous_response_id=first.id, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "64 degrees and clear"}])  # type: ignore[union-attr]
    assert second.status == "completed", second
    assert second.output_text == "The result is 64 degrees and clear."
    assert second.model_extra["setflow"]["verified"] is True
    assert second.model_extra["setflow"]["session"] == first.model_extra["setflow"]["session"]


def test_conversations_their_items_and_a_branch_from_an_earlier_response(stack: Stack) -> None:
    c = sdk(stack)
    conv = c.conversations.create(metadata={"topic": "kpis"})
    assert c.conversations.retrieve(conv.id).metadata == {"topic": "kpis"}
    added = c.conversations.items.create(conv.id, items=[{"type": "message", "role": "user", "content": QUESTION}])
    extra = c.conversations.items.create(conv.id, items=[{"type": "message", "role": "user", "content": "x"}])
    # an item no response has read yet can be taken out (the conversation is answered); once gone, 404
    assert c.conversations.items.delete(extra.data[0].id, conversation_id=conv.id).id == conv.id
    with pytest.raises(openai.NotFoundError):
        c.conversations.items.retrieve(extra.data[0].id, conversation_id=conv.id)
    with pytest.raises(openai.NotFoundError):
        c.conversations.items.delete(extra.data[0].id, conversation_id=conv.id)
    first = c.responses.create(model="small", conversation=conv.id, tools=[LOOKUP], input=[])  # reads the item added
    assert first.output[0].type == "function_call"
    items = c.conversations.items.list(conv.id, order="asc").data
    assert [i.type for i in items] == ["message", "function_call"]
    # an item keeps its id once a response read it (a client paging with `after` finds it), and
    # stays: its tokens are in the conversation's cache
    assert items[0].id == added.data[0].id
    assert c.conversations.items.retrieve(items[0].id, conversation_id=conv.id).id == items[0].id
    assert [i.id for i in c.conversations.items.list(conv.id, order="asc", after=items[0].id).data] == [items[1].id]
    with pytest.raises(openai.BadRequestError, match="cache"):
        c.conversations.items.delete(items[0].id, conversation_id=conv.id)
    # a branch from the first response: a fork of its session, the conversation unchanged
    call = first.output[0]
    branch = c.responses.create(model="small", previous_response_id=first.id, tools=[LOOKUP], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": V1}])  # type: ignore[union-attr]
    again = c.responses.create(model="small", previous_response_id=first.id, tools=[LOOKUP], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "error: no such quarter"}])  # type: ignore[union-attr]
    sessions = {r.model_extra["setflow"]["session"] for r in (first, branch, again)}
    assert len(sessions) == 2, "the first continuation runs on its session, the second on a fork of it"
    assert [i.type for i in c.conversations.items.list(conv.id, order="asc").data][:2] == \
        ["message", "function_call"]
    # items its next response could not read are refused when added (each made every next
    # response refused, with no way to take the item back)
    stray = {"type": "function_call_output", "call_id": "call_x", "output": "5"}
    with pytest.raises(openai.BadRequestError):
        c.conversations.create(items=[stray])
    before = c.conversations.items.list(conv.id, order="asc").data
    for bad in ([stray], [{"type": "message", "role": "user", "content": "x" * 20_000}]):
        with pytest.raises(openai.BadRequestError):
            c.conversations.items.create(conv.id, items=bad)  # type: ignore[arg-type]
    assert c.conversations.items.list(conv.id, order="asc").data == before
    c.conversations.delete(conv.id)
    with pytest.raises(openai.NotFoundError):
        c.conversations.retrieve(conv.id)


def test_background_polled_and_cancelled(stack: Stack) -> None:
    c = sdk(stack)
    r = c.responses.create(model="small", background=True, **LONG)
    assert r.status in ("queued", "in_progress")
    cancelled = c.responses.cancel(r.id)
    deadline = time.monotonic() + 60
    while cancelled.status not in ("cancelled", "completed", "incomplete") and time.monotonic() < deadline:
        time.sleep(0.2)
        cancelled = c.responses.retrieve(r.id)
    assert cancelled.status == "cancelled"
    done = c.responses.create(model="small", background=True, input="Churn fell", max_output_tokens=4)
    while done.status in ("queued", "in_progress"):
        time.sleep(0.2)
        done = c.responses.retrieve(done.id)
    assert done.status in ("completed", "incomplete") and done.output_text


def test_a_stream_resumed_after_a_kill_and_an_api_restart_loses_and_doubles_no_event(stack: Stack) -> None:
    c = sdk(stack)
    for _ in range(3):  # caught mid-decode (400 AR steps): on a loaded machine the client can read too late
        seen: list[Any] = []
        with c.responses.create(model="small", stream=True, **LONG) as events:
            for ev in events:
                seen.append(ev)
                if ev.type == "response.output_text.delta" and len(seen) > 12:
                    break
        rid = seen[0].response.id
        job = c.get(f"/jobs/{rid.removeprefix('resp_')}", cast_to=httpx.Response).json()
        if job["status"] == "running":
            break
    assert job["status"] == "running", job
    kill(stack, job["worker"])  # another worker takes the job over from its first uncommitted step
    try:
        seen += list(c.responses.retrieve(rid, stream=True, starting_after=seen[-1].sequence_number))
    finally:
        restart(stack, job["worker"])
    assert c.get(f"/jobs/{rid.removeprefix('resp_')}", cast_to=httpx.Response).json()["attempts"] == 2
    assert [e.sequence_number for e in seen] == list(range(len(seen))), "every event once, in order"
    final = seen[-1]
    assert final.type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert text == final.response.output_text != ""
    # the API restarted: the same events, the same numbers
    old = stack.api
    old.stop()
    stack._api = ApiServer(stack.s, port=0).start()
    c = sdk(stack)
    replay = list(c.responses.retrieve(rid, stream=True))
    assert [(e.sequence_number, e.type) for e in replay] == [(e.sequence_number, e.type) for e in seen]
    assert [getattr(e, "delta", None) for e in replay] == [getattr(e, "delta", None) for e in seen]


def test_a_response_and_a_native_job_ending_reach_a_webhook_verified_by_the_sdk(stack: Stack) -> None:
    c = sdk(stack)
    with receiver() as rec:
        hook = c.post("/webhooks", body={"url": rec.url, "events": ["response.completed", "response.incomplete",
                                                                        "job.succeeded"]},
                      cast_to=httpx.Response).json()
        r = c.responses.create(model="small", input="Churn fell", max_output_tokens=2)
        native = c.post("/jobs", body={"kind": "turn", "spec": {"text": "Churn fell", "params": {"max_new_tokens": 2}}},
                        cast_to=httpx.Response).json()
        deadline = time.monotonic() + 60
        while len(rec.got) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        events = [c.webhooks.unwrap(got.body.decode(), got.headers, secret=hook["secret"]) for got in rec.got]
        c.delete(f"/webhooks/{hook['id']}", cast_to=httpx.Response)
    assert sorted((e.type, e.data.id) for e in events) == sorted([(f"response.{r.status}", r.id),
                                                                  ("job.succeeded", native["id"])])


def test_store_false_keeps_nothing(stack: Stack) -> None:
    c = sdk(stack)
    r = c.responses.create(model="small", input="Revenue rose", max_output_tokens=4, store=False)
    assert r.status in ("completed", "incomplete")
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        c.get(f"/sessions/{r.model_extra['setflow']['session']}", cast_to=httpx.Response)
    # a stream left after its first event: kept nothing once the response ended (it kept all)
    with c.responses.create(model="small", stream=True, store=False, **LONG) as events:
        rid = next(iter(events)).response.id
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            c.responses.retrieve(rid)
        except openai.NotFoundError:
            return
        time.sleep(0.5)
    raise AssertionError(f"{rid}: its stream was left, and it was kept past its end")


@pytest.mark.parametrize("bad, code", [
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, 400),
    ({"input": "hi", "top_p": 0.5}, 400),
    ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "required": 3}}]}, 400),
    ({"input": "hi", "previous_response_id": "resp_" + "0" * 24}, 404),
    ({"input": "hi", "conversation": "conv_nope"}, 404),
    ({"input": "hi", "background": True, "store": False}, 400),
    ({"input": "hi", "extra_body": {"setflow": {"window": 0}}}, 400),
    ({"input": "hi", "max_output_tokens": 4096}, 400),  # past the model's context: refused, not a job that fails
    ({"input": "hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}}, 400),
    ({"input": "hi", "tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]}, 400),
    ({"input": "What was churn in EMEA in 2026-Q3?", "tools": [{"type": "setflow_metric", "dataset": "nope"}]}, 404),
])
def test_bad_input_gets_openai_errors_and_changes_nothing(stack: Stack, bad: dict[str, Any], code: int) -> None:
    c = sdk(stack)
    before = c.get("/jobs", cast_to=httpx.Response).json()["jobs"]
    with pytest.raises(openai.APIStatusError) as e:
        c.responses.create(model="small", **bad)
    assert e.value.status_code == code
    err = e.value.body
    assert isinstance(err, dict) and err["type"] in ("invalid_request_error",) and err["message"]
    assert c.get("/jobs", cast_to=httpx.Response).json()["jobs"] == before


def test_going_on_from_a_response_refused_makes_no_fork_and_two_at_once_do_not_share_a_session(stack: Stack) -> None:
    """A request from an earlier response that is refused (an output for no call) once forked
    the session first, and left the fork; two sent at once from the latest response both went on
    in its session, each reading the other's turn.  Now the refusal makes nothing, and of two at
    once one goes on in the session, the other in a fork of it."""
    c = sdk(stack)
    def sessions() -> list[str]:
        return sorted(x["id"] for x in c.get("/sessions", cast_to=httpx.Response).json()["sessions"])
    a = c.responses.create(model="small", input="Revenue rose", max_output_tokens=3)
    b = c.responses.create(model="small", input="Churn fell", max_output_tokens=3, previous_response_id=a.id)
    before = sessions()
    for prev in (a, b):  # a is no longer its session's latest: it would fork
        with pytest.raises(openai.BadRequestError):
            c.responses.create(model="small", previous_response_id=prev.id,
                               input=[{"type": "function_call_output", "call_id": "call_q", "output": "1"}])
    assert sessions() == before
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        two = list(pool.map(lambda i: c.responses.create(model="small", input=f"branch {i}", max_output_tokens=3,
                                                         previous_response_id=b.id), range(2)))
    assert len({r.model_extra["setflow"]["session"] for r in two}) == 2, "two at once went on in one session"
    for r in two:  # each read b's history and its own input only
        texts = [t["input"] for t in c.get(f"/sessions/{r.model_extra['setflow']['session']}", cast_to=httpx.Response).json()["turns"]]
        assert sum("branch" in t for t in texts) == 1, texts


def test_a_long_string_input_and_nulls_are_taken_as_openai_takes_them(stack: Stack) -> None:
    """A string input over 256 characters was refused by the items' bound (256 items); null
    for store, background, stream, tools and tool_choice (nullable in OpenAI's reference) was
    refused: each is its default."""
    c = sdk(stack)
    r = c.post("/responses", cast_to=httpx.Response, body={
        "model": "small", "input": "Revenue rose in EMEA. " * 20, "max_output_tokens": 2,
        "store": None, "background": None, "stream": None, "tools": None, "tool_choice": None})
    body = r.json()
    assert r.status_code == 200 and body["status"] in ("completed", "incomplete") and body["store"] is True, body


def test_another_tenants_response_does_not_exist(stack: Stack) -> None:
    r = sdk(stack).responses.create(model="small", input="Churn fell", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        sdk(stack, OTHER).responses.retrieve(r.id)
    with pytest.raises(openai.AuthenticationError):
        sdk(stack, "sk-wrong-key-000").responses.retrieve(r.id)


def test_the_openai_agents_sdk_runs_an_agent_with_a_function_tool(stack: Stack) -> None:
    """openai-agents, tracing off, its default: each model call re-sends the whole history (no
    previous_response_id); the output of the call it ran last names the response that made it,
    whose session goes on from Redis."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    asked: list[tuple[str, str, str]] = []

    @agents.function_tool
    def get_kpi(kpi: str, market: str, quarter: str) -> str:
        """A KPI's value in a market and quarter."""
        asked.append((kpi, market, quarter))
        return OUTPUTS[quarter]

    async def run() -> Any:
        async with openai.AsyncOpenAI(api_key=KEY, base_url=stack.api.url + "/v1", max_retries=0) as client:
            model = agents.OpenAIResponsesModel(model="small", openai_client=client)
            return await agents.Runner.run(agents.Agent(name="analyst", instructions="Answer with the numbers.",
                                                        tools=[get_kpi], model=model), QUESTION)

    result = asyncio.run(run())
    assert asked == [("revenue", "EMEA", "2026-Q2"), ("revenue", "EMEA", "2026-Q3")]
    assert ANSWER in result.final_output
    # a question after the answer, the history re-sent (to_input_list(): the answer's message
    # names its response): it goes on from that response's session, its K/V restored (it was
    # refused: "no call waits for an output here")
    c = sdk(stack)
    last = c.responses.retrieve(result.raw_responses[-1].response_id)
    history = [*result.to_input_list(), {"role": "user", "content": "What was churn in APAC in 2026-Q3?"}]
    follow = c.responses.create(model="small", tools=[LOOKUP], input=history,
                                extra_body={"setflow": {"allow_unverified": True}})  # its check is not this test's
    assert follow.status == "completed", follow
    assert follow.model_extra["setflow"]["session"] == last.model_extra["setflow"]["session"]
    assert [x.role for x in c.responses.input_items.list(follow.id).data] == ["user"]  # the new item alone
    edited = [{**x, "content": [{"type": "output_text", "text": "It fell."}]} if x.get("role") == "assistant" else x
              for x in history]
    with pytest.raises(openai.BadRequestError):  # not what the response wrote: not what its session holds
        c.responses.create(model="small", tools=[LOOKUP], input=edited)
