"""The Responses API as the protocol's other clients hold it (issue #51), with the official
`openai` SDK and plain HTTP against a real stack (test_responses.py's): every field the Open
Responses spec requires on a response object, typed as it types it; extension stream events only
when asked for, named with setflow's prefix; a history compacted into one opaque item that a
chain goes on from; images, files, unknown ids and bad fields answered with OpenAI's errors a
person can act on; histories as the Vercel AI SDK sends them
(item references, calls re-serialised, a previous_response_id beside the re-sent call, the same
previous_response_id on every step of a tool loop, a conversation's question re-sent with its
call's output); the README's agent question ends completed; the
request fields OpenAI's clients send, echoed; a forced tool_choice honoured or refused."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import openai
import pytest

from app.demo import Stack
from tests.runtime.api import test_responses as base
from tests.runtime.api.test_input_files import pdf
from tests.runtime.api.test_responses import LOOKUP, OUTPUTS, sdk
from tests.workflows.test_agent import ANSWER, QUESTION

pytestmark = pytest.mark.slow
stack = base.stack  # test_responses.py's stack (its own, for this module)

#: the response object's fields the Open Responses spec requires (schema ResponseResource.json)
REQUIRED = ["id", "object", "created_at", "completed_at", "status", "incomplete_details", "model",
            "previous_response_id", "instructions", "output", "error", "tools", "tool_choice", "truncation",
            "parallel_tool_calls", "text", "top_p", "presence_penalty", "frequency_penalty", "top_logprobs",
            "temperature", "reasoning", "user", "usage", "max_output_tokens", "max_tool_calls", "store",
            "background", "service_tier", "metadata", "safety_identifier", "prompt_cache_key"]
NUMBERS = ["top_p", "presence_penalty", "frequency_penalty", "temperature"]
#: the README's agent question, its lookup a function the client runs (names as the README gives them)
GET_METRIC: dict[str, Any] = {"type": "function", "name": "get_metric", "parameters": {
    "type": "object", "properties": {"metric": {"type": "string"}, "region": {"type": "string"},
                                     "period": {"type": "string"}}, "required": ["metric", "region", "period"]}}
README_Q3, README_Q2 = "What was churn in APAC in 2026-Q3?", "What was churn in APAC in 2026-Q2?"


def client(stack: Stack) -> Any:
    """The official SDK's client, untyped: these tests send what its types do not list."""
    return sdk(stack)


def post(stack: Stack, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(stack.api.url + path, json=body, headers={"Authorization": "Bearer sk-resp-acme-0001"},
                      timeout=120)


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    assert {"message", "type", "param", "code"} <= set(err), err
    return err


def test_a_response_object_holds_every_field_the_spec_requires_typed_and_echoes_the_request(stack: Stack) -> None:
    """Before: no completed_at, penalties, top_logprobs, reasoning, max_tool_calls, service_tier,
    safety_identifier or prompt_cache_key; temperature null; echoed tools without `strict`."""
    asked = {"reasoning": {"effort": "low", "summary": None}, "service_tier": "auto", "safety_identifier": "user-7",
             "prompt_cache_key": "kpis", "prompt_cache_retention": "24h", "top_logprobs": 3, "max_tool_calls": 4,
             "include": ["message.output_text.logprobs"], "user": "u-1"}
    r = post(stack, "/v1/responses", {"model": "small", "input": QUESTION, "tools": [LOOKUP], **asked})
    body = r.json()  # a call of get_kpi: completed
    assert r.status_code == 200, body
    missing = [k for k in REQUIRED if k not in body]
    assert not missing, missing
    for k in NUMBERS:
        assert isinstance(body[k], (int, float)) and not isinstance(body[k], bool), (k, body[k])
    assert isinstance(body["top_logprobs"], int) and isinstance(body["service_tier"], str)
    assert isinstance(body["completed_at"], int) and body["completed_at"] >= body["created_at"]
    assert body["status"] == "completed" and body["output"][0]["type"] == "function_call", body
    assert body["tools"] == [{**LOOKUP, "strict": True}]
    for k in ("reasoning", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "top_logprobs",
              "max_tool_calls", "user"):
        assert body[k] == asked[k], (k, body[k])
    queued = post(stack, "/v1/responses", {"model": "small", "input": "Churn fell", "max_output_tokens": 2,
                                           "background": True}).json()
    assert queued["completed_at"] is None and queued["temperature"] == 0
    text = post(stack, "/v1/responses", {"model": "small", "input": "Churn fell", "max_output_tokens": 2,
                                         "tools": [{"type": "function", "name": "f"}], "tool_choice": "none"}).json()
    assert text["tools"] == [{"type": "function", "name": "f", "description": None, "parameters": None, "strict": True}]
    assert text["output"][0]["content"][0]["logprobs"] == [] and (text["completed_at"] is None) == \
        (text["status"] != "completed")


def test_extension_events_only_when_asked_and_named_with_the_prefix(stack: Stack) -> None:
    """Before: every stream held `setflow.step` events, which a client validating events refuses."""
    c = client(stack)
    plain = [e.type for e in c.responses.create(model="small", input="Revenue rose", max_output_tokens=6, stream=True)]
    assert plain[0] == "response.created" and plain[-1] in ("response.completed", "response.incomplete")
    assert all(t.startswith("response.") for t in plain), plain
    asked = [e.type for e in c.responses.create(model="small", input="Revenue rose", max_output_tokens=6, stream=True,
                                                extra_body={"setflow": {"step_events": True}})]
    assert "setflow:step" in asked and "setflow.step" not in asked, asked
    assert [t for t in asked if t != "setflow:step"] == plain  # the same events besides


def test_compact_keeps_the_chains_messages_in_one_opaque_item_and_the_chain_goes_on(stack: Stack) -> None:
    """Before: POST /v1/responses/compact was a 400 ('setflow does not compact a history')."""
    c = client(stack)
    first = c.responses.create(model="small", input="Revenue rose in EMEA.", max_output_tokens=8)
    second = c.responses.create(model="small", previous_response_id=first.id, input="Churn fell in APAC.",
                                max_output_tokens=8)
    done = c.responses.compact(model="small", previous_response_id=second.id, prompt_cache_key="k")
    assert done.object == "response.compaction" and done.usage.total_tokens == 0
    [item] = done.output
    assert item.type == "compaction" and "EMEA" not in item.encrypted_content
    going = c.responses.create(model="small", max_output_tokens=8, input=[
        item.model_dump(exclude_none=True), {"role": "user", "content": "Why?"}])
    assert going.status in ("completed", "incomplete") and going.previous_response_id is None
    read = [(x.role, x.content[0].text) for x in c.responses.input_items.list(going.id, order="asc").data]
    said = [("user", "Revenue rose in EMEA."), ("assistant", first.output_text), ("user", "Churn fell in APAC."),
            ("assistant", second.output_text)]
    assert read == [m for m in said if m[1]] + [("user", "Why?")], read  # in order; an empty answer is no message
    # another tenant's, or an edited one: a 400 that says so; nothing to keep: a 400
    other = httpx.post(stack.api.url + "/v1/responses", headers={"Authorization": f"Bearer {base.OTHER}"},
                       json={"model": "small", "input": [item.model_dump(exclude_none=True), {"role": "user",
                                                                                          "content": "Why?"}]})
    assert other.status_code == 400 and "not one setflow made for this tenant" in error_of(other)["message"]
    r = post(stack, "/v1/responses/compact", {"model": "small", "input": [
        {"type": "function_call_output", "call_id": "call_x", "output": "2.7"}]})
    assert r.status_code == 400 and "no message to keep" in error_of(r)["message"]
    # the spec's CompactResponseMethodPublicBody requires model (the suite's compact-missing-model:
    # a 200 before)
    r = post(stack, "/v1/responses/compact", {"input": [{"type": "message", "role": "user", "content": "Compact."}]})
    err = error_of(r)
    assert r.status_code == 400 and err["param"] == "model" and err["message"] == "model: is required", err
    put = httpx.put(stack.api.url + "/v1/responses", headers={"Authorization": "Bearer sk-resp-acme-0001"})
    assert put.status_code == 405 and error_of(put)["type"] == "invalid_request_error"


def test_an_image_is_refused_in_words_and_a_text_file_and_a_pdf_are_read(stack: Stack) -> None:
    """Before: both were a 400 whose message was pydantic's dump of every union branch."""
    image = {"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                         {"type": "input_image", "image_url": "https://example.com/a.png"}]}
    r = post(stack, "/v1/responses", {"model": "small", "input": [image]})
    err = error_of(r)
    assert r.status_code == 400 and "text only" in err["message"] and err["param"] == "input[0].content[1]", err
    assert "Input should" not in err["message"] and ";" not in err["message"], err
    csv = base64.b64encode(b"market,revenue\nEMEA,812\n").decode()
    c = client(stack)
    for part in ({"type": "input_file", "filename": "kpis.csv", "file_data": f"data:text/csv;base64,{csv}"},
                 {"type": "input_file", "filename": "kpis.csv", "file_data": csv}):
        r2 = c.responses.create(model="small", max_output_tokens=2, input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Revenue by market:"}, part]}])
        [item] = c.responses.input_items.list(r2.id).data
        assert item.content[0].text == "Revenue by market:\nmarket,revenue\nEMEA,812"
    # a PDF is read as its pages' text (the Open Responses suite's file-input test: a 400 before);
    # one PDFium cannot open is refused in words
    doc = base64.b64encode(pdf("Title: Quarterly KPIs")).decode()
    r3 = c.responses.create(model="small", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Its title only:"},
        {"type": "input_file", "filename": "k.pdf", "file_data": f"data:application/pdf;base64,{doc}"}]}])
    [item] = c.responses.input_items.list(r3.id).data
    assert item.content[0].text == "Its title only:\nTitle: Quarterly KPIs" and r3.status == "completed", r3
    bad = {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0xLjQ="}
    err = error_of(post(stack, "/v1/responses", {"model": "small", "input": [{"role": "user", "content": [bad]}]}))
    assert "'a.pdf' is no PDF setflow can read" in err["message"] and err["param"] == "input[0].content[0]", err


def test_context_management_compacts_a_chain_past_its_threshold_and_the_chain_goes_on(stack: Stack) -> None:
    """Before: context_management was a 400 ('is not a field setflow reads here')."""
    c = client(stack)
    first = c.responses.create(model="small", input="Revenue rose in EMEA.", max_output_tokens=8)
    cm = {"context_management": [{"type": "compaction", "compact_threshold": 1}]}  # past it at once
    second = c.responses.create(model="small", previous_response_id=first.id, input="Churn fell in APAC.",
                                max_output_tokens=8, extra_body=cm)
    assert [x.type for x in second.output] == ["compaction", "message"], second.output
    assert second.usage.input_tokens_details.cached_tokens == 0  # a session of its own
    read = [(x.role, x.content[0].text) for x in c.responses.input_items.list(second.id, order="asc").data]
    said = [("user", "Revenue rose in EMEA."), ("assistant", first.output_text), ("user", "Churn fell in APAC.")]
    assert read == [m for m in said if m[1]], read
    # not past its threshold: it goes on in the session as it is
    third = c.responses.create(model="small", previous_response_id=second.id, input="Why?", max_output_tokens=8,
                               extra_body={"context_management": [{"type": "compaction", "compact_threshold": 10**6}]})
    assert [x.type for x in third.output] == ["message"] and third.usage.input_tokens_details.cached_tokens > 0
    # a stateless client appends the output, the compaction item in it: read from that item on,
    # and its answer names where the session is (second's), so only the new question is read
    history = [{"role": "user", "content": "Revenue rose in EMEA."}, *[x.model_dump(exclude_none=True) for x in
                                                                      second.output], {"role": "user", "content": "Why?"}]
    going = c.responses.create(model="small", input=history, max_output_tokens=8)
    assert [x.content[0].text for x in c.responses.input_items.list(going.id).data] == ["Why?"]
    assert going.usage.input_tokens_details.cached_tokens > 0
    # streamed: the compaction item first (output_index 0), the message after it (1)
    events = list(c.responses.create(model="small", previous_response_id=first.id, input="Churn fell in APAC.",
                                     max_output_tokens=8, extra_body=cm, stream=True))
    added = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"]
    assert added == [(0, "compaction"), (1, "message")], added
    assert {e.output_index for e in events if e.type == "response.output_text.delta"} <= {1}
    assert [x.type for x in events[-1].response.output] == ["compaction", "message"]


@pytest.mark.parametrize("bad, param, words", [
    ({"input": [{"type": "message", "content": "hi"}]}, "input[0].role", "is required"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "'reasoning' is not one"),
    ({"input": "hi", "temperature": "hot"}, "temperature", "number"),
    ({"input": "hi", "frobnicate": 1}, "frobnicate", "not a field"),
])
def test_a_bad_field_is_named_once_with_what_to_do(stack: Stack, bad: dict[str, Any], param: str, words: str) -> None:
    r = post(stack, "/v1/responses", {"model": "small", **bad})
    err = error_of(r)
    assert r.status_code == 400 and err["param"] == param and words in err["message"], err
    assert err["message"].startswith(param + ": ") and "Input should be a valid string" not in err["message"], err


@pytest.mark.parametrize("rid", ["resp_does_not_exist", "resp_" + "f" * 24, "compacted", "msg_1"])
def test_an_unknown_response_id_of_any_form_is_a_404(stack: Stack, rid: str) -> None:
    """Before: an id not of setflow's form (resp_does_not_exist) was a 400."""
    c = client(stack)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(rid)
    with pytest.raises(openai.NotFoundError):
        c.responses.input_items.list(rid)
    with pytest.raises(openai.NotFoundError):
        c.responses.cancel(rid)
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(rid)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="small", input="hi", previous_response_id=rid)


def _loop(c: Any, history: list[dict[str, Any]], send: Any, **kw: Any) -> Any:
    """The function-calling loop of a stateless client: the whole history re-sent each time,
    each call as `send(call)` says, then its output."""
    r = c.responses.create(model="small", input=history, tools=[LOOKUP], **kw)
    while r.output and r.output[0].type == "function_call":
        call = r.output[0]
        history = [*history, send(call), {"type": "function_call_output", "call_id": call.call_id,
                                          "output": OUTPUTS[json.loads(call.arguments)["quarter"]]}]
        r = c.responses.create(model="small", input=history, tools=[LOOKUP], **kw)
    return r


def test_item_references_are_read_as_the_items_they_name(stack: Stack) -> None:
    """The Vercel AI SDK with store on sends its calls as item references; they were refused."""
    c = client(stack)
    r = _loop(c, [{"role": "user", "content": QUESTION}], lambda call: {"type": "item_reference", "id": call.id})
    assert ANSWER in r.output_text and r.model_extra["setflow"]["verified"] is True, r
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="small", input=[{"type": "item_reference", "id": "msg_" + "0" * 24 + "_0"}])


def test_a_call_re_sent_in_compact_json_is_the_call_made(stack: Stack) -> None:
    """The SDK re-sends `{"kpi":"revenue",...}`; setflow wrote `{"kpi": "revenue", ...}` and,
    comparing bytes, answered 400 "is not a call response ... made as the input says"."""
    c = client(stack)

    def compact(call: Any) -> dict[str, Any]:
        return {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": json.dumps(json.loads(call.arguments), separators=(",", ":"))}
    r = _loop(c, [{"role": "user", "content": QUESTION}], compact)
    assert ANSWER in r.output_text, r
    first = c.responses.create(model="small", input=QUESTION, tools=[LOOKUP])
    call = first.output[0]
    other = {**compact(call), "arguments": json.dumps({**json.loads(call.arguments), "quarter": "2025-Q1"})}
    with pytest.raises(openai.BadRequestError, match="not a call"):
        c.responses.create(model="small", tools=[LOOKUP], input=[
            {"role": "user", "content": QUESTION}, other,
            {"type": "function_call_output", "call_id": call.call_id, "output": "1"}])


def test_a_previous_response_id_beside_the_re_sent_call_reads_only_what_follows(stack: Stack) -> None:
    """A request naming previous_response_id that also re-sends the question and the call: the
    items the previous response holds are not new input (they were stored, listed and read as
    new)."""
    c = client(stack)
    first = c.responses.create(model="small", input=QUESTION, tools=[LOOKUP])
    call = first.output[0]
    args = json.dumps(json.loads(call.arguments), separators=(",", ":"))
    sent = [{"role": "user", "content": QUESTION},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": args},
            {"type": "function_call_output", "call_id": call.call_id, "output": OUTPUTS["2026-Q2"]}]
    nxt = c.responses.create(model="small", previous_response_id=first.id, tools=[LOOKUP], input=sent)
    assert nxt.status == "completed", nxt
    assert [x.type for x in c.responses.input_items.list(nxt.id).data] == ["function_call_output"]
    wrong = [sent[0], {**sent[1], "name": "get_other"}, sent[2]]
    with pytest.raises(openai.BadRequestError, match="not the call"):
        c.responses.create(model="small", previous_response_id=first.id, tools=[LOOKUP], input=wrong)


def _readme_answer(c: Any) -> Any:
    first = c.responses.create(model="small", input=README_Q3, tools=[GET_METRIC])
    [call] = first.output
    assert call.type == "function_call" and json.loads(call.arguments) == {
        "metric": "churn", "region": "APAC", "period": "2026-Q3"}
    return c.responses.create(model="small", previous_response_id=first.id, tools=[GET_METRIC],
                              input=[{"type": "function_call_output", "call_id": call.call_id, "output": "2.7"}])


def test_the_readmes_agent_question_answered_by_the_clients_get_metric_ends_completed(stack: Stack) -> None:
    """The output "2.7" gives no unit, and the answer writes none (it wrote "2.7 %": unverified)."""
    done = _readme_answer(client(stack))
    assert done.status == "completed" and done.model_extra["setflow"]["verified"] is True, done
    assert done.output_text == "churn in APAC in 2026-Q3 was 2.7."


def test_a_step_naming_the_loops_first_response_goes_on_from_the_call_it_answers(stack: Stack) -> None:
    """The Vercel AI SDK names the same previous_response_id on every step of its tool loop and
    re-sends the question and the calls made since, each with its output: the output answers a
    call of a later response that went on from the one named (it was refused: "no call waits
    for an output here").  A call of a response that did not go on from it is refused."""
    c = client(stack)
    done = _readme_answer(c)
    step = c.responses.create(model="small", previous_response_id=done.id, tools=[GET_METRIC], input=README_Q2)
    [call] = step.output
    assert call.type == "function_call", step
    sent = [{"role": "user", "content": README_Q2},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": json.dumps(json.loads(call.arguments), separators=(",", ":"))},
            {"type": "function_call_output", "call_id": call.call_id, "output": "2.5"}]
    nxt = c.responses.create(model="small", previous_response_id=done.id, tools=[GET_METRIC], input=sent)
    assert nxt.status == "completed" and nxt.output_text == "churn in APAC in 2026-Q2 was 2.5.", nxt
    assert nxt.model_extra["setflow"]["session"] == step.model_extra["setflow"]["session"]  # where the call waited
    assert [x.type for x in c.responses.input_items.list(nxt.id).data] == ["function_call_output"]
    apart = c.responses.create(model="small", input=README_Q3, tools=[GET_METRIC]).output[0]
    with pytest.raises(openai.BadRequestError, match="did not go on from"):
        c.responses.create(model="small", previous_response_id=done.id, tools=[GET_METRIC], input=[
            {"type": "function_call_output", "call_id": apart.call_id, "output": "2.7"}])


def test_a_question_re_sent_with_a_calls_output_in_a_conversation_is_held_once(stack: Stack) -> None:
    """The Vercel AI SDK in a conversation sends the step's question again with the call's output
    (and leaves out the call, which the conversation holds): the question was stored, and listed,
    twice, though the model read it once."""
    c = client(stack)
    conv = c.conversations.create()
    first = c.responses.create(model="small", conversation=conv.id, input=README_Q3, tools=[GET_METRIC])
    [call] = first.output
    done = c.responses.create(model="small", conversation=conv.id, tools=[GET_METRIC], input=[
        {"role": "user", "content": README_Q3}, {"type": "function_call_output", "call_id": call.call_id, "output": "2.7"}])
    assert done.output_text == "churn in APAC in 2026-Q3 was 2.7.", done
    assert [x.type for x in c.responses.input_items.list(done.id).data] == ["function_call_output"]
    items = c.conversations.items.list(conv.id, order="asc").data
    assert [x.type for x in items] == ["message", "function_call", "function_call_output", "message"], items


def test_max_tool_calls_bounds_the_calls(stack: Stack) -> None:
    """max_tool_calls was taken and ignored: with 0 the model called get_kpi."""
    r = client(stack).responses.create(model="small", input=QUESTION, tools=[LOOKUP], max_tool_calls=0)
    assert r.status == "failed" and r.error is not None and "call limit (0)" in r.error.message, r
    assert r.max_tool_calls == 0


def test_phase_on_an_input_message_is_kept(stack: Stack) -> None:
    c = client(stack)
    r = c.responses.create(model="small", max_output_tokens=2, input=[
        {"role": "assistant", "content": "Revenue rose.", "phase": "final_answer"},
        {"role": "user", "content": "By how much?"}])
    assert [x.model_dump().get("phase") for x in c.responses.input_items.list(r.id, order="asc").data] == \
        ["final_answer", None]


def _first_turn(events: list[Any]) -> str:
    """What the response's first turn wrote, from its setflow:step events (positions, pieces)."""
    steps = [e.model_dump() for e in events if e.type == "setflow:step"]
    first = [s for s in steps if s["turn"] == steps[0]["turn"]]
    return "".join(x for _, x in sorted((p, x) for s in first for p, x in zip(s["positions"], s["pieces"])))


def test_a_forced_tool_choice_opens_the_call_and_one_the_model_cannot_make_is_refused(stack: Stack) -> None:
    """tool_choice {"type": "function", "name"} and `required` were accepted and ignored."""
    c = client(stack)
    statement = "Revenue in EMEA rose in 2026-Q3."  # no question: left to itself the model calls nothing
    wrote = {}
    for choice in ("auto", {"type": "function", "name": "get_kpi"}, "required"):
        events = list(c.responses.create(model="small", input=statement, tools=[LOOKUP], tool_choice=choice,
                                         stream=True, extra_body={"setflow": {"step_events": True}}))
        wrote[json.dumps(choice)] = _first_turn(events)
    assert not wrote['"auto"'].startswith("<call>"), wrote
    assert wrote[json.dumps({"type": "function", "name": "get_kpi"})].startswith("<call>metric("), wrote
    assert wrote['"required"'].startswith("<call>metric("), wrote  # its one tool the model can call
    mail = {"type": "function", "name": "send_mail", "parameters": {"type": "object", "properties": {"to": {"type": "integer"}}}}
    for choice, words in (({"type": "function", "name": "send_mail"}, "send_mail's parameters are neither"),
                          ("required", "can call none of the tools")):
        r = post(stack, "/v1/responses", {"model": "small", "input": statement, "tools": [mail], "tool_choice": choice})
        err = error_of(r)
        assert r.status_code == 400 and words in err["message"], err
