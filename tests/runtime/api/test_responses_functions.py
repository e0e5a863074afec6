"""Client functions of several parameters through the Responses API, against real worker processes,
a real Redis and SQLite (app.demo.Stack), driven as the clients drive them: the official `openai`
SDK (a loop over previous_response_id, and streamed), the history re-sent whole with the call's
arguments as compact JSON (the Vercel AI SDK's way), and openai-agents' Runner with a typed
function tool.  Each call's arguments are what the question writes for them and validate against
the function's schema; the function's output is quoted by a verified answer; a question that does
not give a required value gets no call, and a failed response that says which.

The questions are this module's own: no training template writes them (domain/agent.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, Literal

import jsonschema
import openai
import pytest

from app.demo import Stack
from tests.runtime.api import test_responses as base
from tests.runtime.api.test_responses import KEY

pytestmark = pytest.mark.slow
stack = base.stack  # test_responses.py's stack (its own, for this module)
WEATHER: dict[str, Any] = {"type": "function", "name": "get_weather", "description": "The weather in a city, now",
                           "parameters": {"type": "object", "required": ["city", "unit"], "properties": {
                               "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}}}
FORECAST: dict[str, Any] = {"type": "function", "name": "get_forecast", "description": "A city's forecast",
                            "parameters": {"type": "object", "required": ["city", "days"], "properties": {
                                "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
                                "alerts": {"type": "boolean"}}}}


@pytest.fixture()
def sdk(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(api_key=KEY, base_url=stack.api.url + "/v1", max_retries=0, timeout=120) as c:
        yield c


def call_of(r: Any, function: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The response's one item, a function_call of `function`, and its arguments (schema-valid)."""
    assert r.status == "completed", r.error
    [call] = r.output
    assert call.type == "function_call" and call.name == function["name"], r.output
    args = json.loads(call.arguments)
    jsonschema.validate(args, function["parameters"])
    return call, args


def test_a_function_of_two_parameters_over_previous_response_id(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(model="small", input="What's the weather in Paris in °F?", tools=[WEATHER])
    call, args = call_of(first, WEATHER)
    assert args == {"city": "Paris", "unit": "f"}
    second = sdk.responses.create(model="small", previous_response_id=first.id, tools=[WEATHER], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "72 and sunny"}])
    assert second.status == "completed" and second.output_text == "The result is 72 and sunny.", second
    assert second.model_extra["setflow"]["verified"] is True
    assert second.model_extra["setflow"]["session"] == first.model_extra["setflow"]["session"]


def test_a_streamed_loop_gives_the_calls_arguments_and_the_answer_in_openais_events(sdk: openai.OpenAI) -> None:
    """Both responses streamed: the call's arguments in function_call_arguments.done (as its
    item has them), then the answer's text in output_text.done, each ending response.completed."""
    with sdk.responses.create(model="small", input="Will it rain in Oslo over the next 3 days?", tools=[FORECAST],
                              stream=True) as events:
        seen = list(events)
    assert seen[-1].type == "response.completed", [e.type for e in seen]
    [done] = [e for e in seen if e.type == "response.function_call_arguments.done"]
    assert json.loads(done.arguments) == {"city": "Oslo", "days": 3}  # "alerts", optional, not given: left out
    first = seen[-1].response
    call, args = call_of(first, FORECAST)
    assert json.loads(done.arguments) == args
    with sdk.responses.create(model="small", previous_response_id=first.id, tools=[FORECAST], stream=True, input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "rain, then snow"}]) as events:
        seen = list(events)
    assert seen[-1].type == "response.completed", [e.type for e in seen]
    [text] = [e.text for e in seen if e.type == "response.output_text.done"]
    assert text == "The result is rain, then snow." == seen[-1].response.output_text
    assert seen[-1].response.model_extra["setflow"]["verified"] is True


def test_a_loop_that_re_sends_its_history_with_compact_arguments(sdk: openai.OpenAI) -> None:
    """The Vercel AI SDK's way: no previous_response_id, the whole history each step, the call's
    arguments as the SDK writes JSON (no spaces); an output that is a number is the answer's."""
    question = "Weather for San Francisco, in C please."
    first = sdk.responses.create(model="small", input=question, tools=[WEATHER])
    call, args = call_of(first, WEATHER)
    assert args == {"city": "San Francisco", "unit": "c"}
    second = sdk.responses.create(model="small", tools=[WEATHER], input=[
        {"role": "user", "content": question},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": json.dumps(args, separators=(",", ":"))},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18"}])
    assert second.status == "completed" and second.output_text == "The result is 18.", second
    assert second.model_extra["setflow"]["verified"] is True


def test_openai_agents_runs_a_typed_function_of_several_parameters(stack: Stack) -> None:
    """openai-agents' function_tool writes a strict schema from the function's types (an int, a
    Literal: an enum); the Runner sends the history whole each step."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    asked: list[tuple[str, int, str]] = []

    @agents.function_tool
    def get_forecast(city: str, days: int, unit: Literal["c", "f"]) -> str:
        """A city's forecast for the next days."""
        asked.append((city, days, unit))
        return "rain, then snow"

    async def run() -> Any:
        async with openai.AsyncOpenAI(api_key=KEY, base_url=stack.api.url + "/v1", max_retries=0) as client:
            model = agents.OpenAIResponsesModel(model="small", openai_client=client)
            return await agents.Runner.run(agents.Agent(name="forecaster", instructions="Answer from the tool.",
                                                        tools=[get_forecast], model=model),
                                           "Forecast for Oslo in °C for the next 4 days?")

    result = asyncio.run(run())
    assert asked == [("Oslo", 4, "c")]
    assert result.final_output == "The result is rain, then snow."


@pytest.mark.parametrize("question, choice, missing", [
    ("What's the weather in Paris?", "auto", "unit: the question writes none of its values ('c', 'f')"),
    ("What's the weather in Paris in C or F?", {"type": "function", "name": "get_weather"},
     "unit: the question writes 2 of its values"),
])
def test_a_question_that_does_not_give_a_required_value_gets_no_call_and_a_failed_response_saying_which(
        sdk: openai.OpenAI, question: str, choice: Any, missing: str) -> None:
    r = sdk.responses.create(model="small", input=question, tools=[WEATHER], tool_choice=choice)
    assert r.status == "failed" and r.error is not None and r.error.code == "no_answer", r  # type: ignore[comparison-overlap]
    assert f"get_weather: {missing}" in r.error.message and not [x for x in r.output if x.type == "function_call"]


FIB: dict[str, Any] = {"type": "function", "name": "get_fibonacci", "description": "The n-th Fibonacci number",
                       "parameters": {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}}
CITIES: dict[str, Any] = {"type": "function", "name": "compare_cities", "description": "Compares cities",
                          "parameters": {"type": "object", "required": ["cities"], "properties": {
                              "cities": {"type": "array", "items": {"type": "string"}, "minItems": 2}}}}
EVENT: dict[str, Any] = {"type": "function", "name": "create_event", "description": "Creates an event",
                         "parameters": {"type": "object", "required": ["event"], "properties": {
                             "event": {"type": "object", "properties": {"title": {"type": "string"}}}}}}


@pytest.mark.parametrize("function, question, arguments, output", [
    (FIB, "What is the 10th Fibonacci number?", {"n": 10}, "55"),  # a number only: "the 10th"
    (CITIES, "Compare Paris and Rome", {"cities": ["Paris", "Rome"]}, "Rome is warmer"),  # an array of the names
])
def test_a_function_of_no_string_is_called_with_the_questions_values(
        sdk: openai.OpenAI, function: dict[str, Any], question: str, arguments: dict[str, Any], output: str) -> None:
    first = sdk.responses.create(model="small", input=question, tools=[function])
    call, args = call_of(first, function)
    assert args == arguments
    second = sdk.responses.create(model="small", previous_response_id=first.id, tools=[function], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": output}])
    assert second.status == "completed" and second.output_text == f"The result is {output}.", second


def test_a_function_of_an_object_is_never_called_and_the_response_fails_saying_why(sdk: openai.OpenAI) -> None:
    """No call made up from a value nothing fills: failed, naming the parameter (it was a text response)."""
    r = sdk.responses.create(model="small", input="Create an event called Launch in Paris.", tools=[EVENT])
    assert r.status == "failed" and r.error is not None and r.error.code == "no_answer", r  # type: ignore[comparison-overlap]
    assert "create_event: event: an object is not filled from a question" in r.error.message
    assert not [x for x in r.output if x.type == "function_call"]


def test_openai_agents_runs_a_function_of_one_boolean(stack: Stack) -> None:
    """openai-agents' strict schema of `on: bool`: "Turn the lights on" calls it with true."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    asked: list[bool] = []

    @agents.function_tool
    def toggle_lights(on: bool) -> str:
        """Switches the lights."""
        asked.append(on)
        return "lights are on" if on else "lights are off"

    async def run() -> Any:
        async with openai.AsyncOpenAI(api_key=KEY, base_url=stack.api.url + "/v1", max_retries=0) as client:
            model = agents.OpenAIResponsesModel(model="small", openai_client=client)
            return await agents.Runner.run(agents.Agent(name="home", instructions="Use the tool.",
                                                        tools=[toggle_lights], model=model), "Turn the lights on")

    result = asyncio.run(run())
    assert asked == [True]
    assert result.final_output == "The result is lights are on."
