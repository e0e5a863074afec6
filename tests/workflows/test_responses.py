"""workflows/responses.py over a session in this process (the shipped model): a response ends at
the call of a client's function, its arguments under the function's own parameter names and
fitting its schema; the next response goes on from the parked state with the call's output, on
the same session, and the whole conversation is token for token the native agent's with the
same outputs; a call that does not fit the schema is answered here; a text response is one turn."""

from __future__ import annotations

import json
from typing import Any

import pytest

from domain.markup import SLOT_TOKENS
from domain.tools import CALL, END_CALL, END_RESULT, RESULT
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import NoAnswer
from runtime.jobs.kinds import ResponseSpec
from runtime.jobs.specs import AgentSpec
from runtime.sessions.local import LocalTurns
from tests.workflows.test_agent import ANSWER, DATA, QUESTION, V1, V2
from workflows import agent, responses

# the client's names for the lookup's three names: its own parameters, in (what, where, when) order
LOOKUP: dict[str, Any] = {"type": "function", "name": "get_kpi", "description": "a KPI's value",
                          "parameters": {"type": "object", "required": ["kpi", "market", "quarter"],
                                         "properties": {"kpi": {"type": "string", "enum": ["revenue", "churn"]},
                                                        "market": {"type": "string", "enum": ["EMEA", "APAC"]},
                                                        "quarter": {"type": "string"}}}}
# the README's question, its lookup the client's: the names as the README gives them, no enum
GET_METRIC: dict[str, Any] = {"type": "function", "name": "get_metric",
                              "parameters": {"type": "object", "required": ["metric", "region", "period"],
                                             "properties": {"metric": {"type": "string"}, "region": {"type": "string"},
                                                            "period": {"type": "string"}}}}
README_QUESTION = "What was churn in APAC in 2026-Q3?"
UNRELATED: dict[str, Any] = {"type": "function", "name": "send_mail",
                             "parameters": {"type": "object", "properties": {"to": {"type": "integer"}}}}


def respond(turns: LocalTurns, **spec: Any) -> dict[str, Any]:
    return responses.run(turns, ResponseSpec.model_validate({"mode": "agent", "functions": [UNRELATED, LOOKUP], **spec}))


def test_a_function_call_parks_the_response_and_the_next_goes_on_token_identical_to_the_native_agent(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    conv = LocalTurns(*loaded)
    first = respond(conv, question=QUESTION)
    [item] = first["output"]
    assert item["type"] == "function_call" and item["name"] == "get_kpi"
    assert json.loads(item["arguments"]) == {"kpi": "revenue", "market": "EMEA", "quarter": "2026-Q2"}
    assert first["status"] == "completed" and first["parked"]["question"] == QUESTION
    second = respond(conv, parked=first["parked"], output=V1)
    [item] = second["output"]
    assert json.loads(item["arguments"]) == {"kpi": "revenue", "market": "EMEA", "quarter": "2026-Q3"}
    assert second["usage"]["cached"] == conv.used() - second["usage"]["prefill"] - second["usage"]["output"]
    third = respond(conv, parked=second["parked"], output=V2)
    [message] = third["output"]
    assert message["type"] == "message" and ANSWER in message["text"] and third["verified"] is True
    assert [c["by"] for c in third["calls"]] == ["client", "client", "server"]  # calc: a built-in skill
    # the native agent, its client running the metric tool with the same names and outputs
    native = LocalTurns(*loaded, tool_outputs={"call_1": V1, "call_2": V2})
    # (the periods too: get_kpi lists none for `quarter`, so the Responses path takes the question's)
    done = agent.run(native, AgentSpec(question=QUESTION, client_tools=["metric"],
                                       names=["revenue", "churn", "EMEA", "APAC", "2026-Q2", "2026-Q3"]))
    assert done["answer"] == message["text"]
    assert conv.state is not None and native.state is not None
    assert conv.state.tokens == native.state.tokens, "the same conversation, token for token"


def test_a_call_outside_the_schema_is_answered_here_and_never_reaches_the_client(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    narrow = json.loads(json.dumps(LOOKUP))
    narrow["parameters"]["properties"]["quarter"]["pattern"] = "^Q[1-4]$"  # "2026-Q2" does not fit
    spec = ResponseSpec.model_validate({"mode": "agent", "functions": [narrow], "question": QUESTION, "max_calls": 2})
    assert spec.functions[0].problem({"kpi": "revenue", "market": "EMEA", "quarter": "2026-Q2"}) == \
        "get_kpi: '2026-Q2' does not match '^Q[1-4]$'"
    try:
        out = responses.run(LocalTurns(*loaded), spec)
    except NoAnswer as e:  # no answer (the refused call written again until the limit, or none after
        # its error): the response failed, and no call reached the client
        assert e.code == "no_answer" and ("call limit" in e.message or "no A:" in e.message), e.message
    else:  # whatever it ended with, no call the schema refuses went out
        assert all(json.loads(i["arguments"])["quarter"] in ("Q1", "Q2", "Q3", "Q4")
                   for i in out["output"] if i["type"] == "function_call")


@pytest.mark.parametrize("params, attempt, resent", [
    ({}, "first", [GET_METRIC]),
    # sampled hot: its answer's words held to the answer forms and its unit to the rows' (the
    # guides), it is verified on its first decode (before the answer guide it wrote a stray number)
    ({"temperature": 1.5, "seed": 8}, "first", [GET_METRIC]),
    # the output sent with no tools (the Open Responses suite's way): the call was the client's all
    # the same, and its output gives no unit (the sample metric's "%" was written, and verified)
    ({}, "first", []),
])
def test_the_readmes_question_answered_by_the_clients_tool_writes_no_unit_its_output_lacks(
        loaded: tuple[SetDLM, Tokenizer], params: dict[str, Any], attempt: str, resent: list[dict[str, Any]]) -> None:
    conv = LocalTurns(*loaded)
    first = responses.run(conv, ResponseSpec.model_validate(
        {"mode": "agent", "functions": [GET_METRIC], "question": README_QUESTION}))
    [call] = first["output"]
    assert json.loads(call["arguments"]) == {"metric": "churn", "region": "APAC", "period": "2026-Q3"}
    second = responses.run(conv, ResponseSpec.model_validate(
        {"mode": "agent", "functions": resent, "parked": first["parked"], "output": "2.7", "params": params}))
    [message] = second["output"]
    assert second["status"] == "completed" and second["verified"] is True and second["attempt"] == attempt
    assert message["text"].endswith("was 2.7."), message["text"]  # no "%": the output "2.7" gives no unit


def test_a_text_response_is_one_turn_and_says_when_its_limit_cut_it(loaded: tuple[SetDLM, Tokenizer]) -> None:
    turns = LocalTurns(*loaded)
    out = responses.run(turns, ResponseSpec.model_validate(
        {"mode": "text", "text": "Revenue rose in EMEA", "params": {"max_new_tokens": 3, "policy": "ar", "window": 1}}))
    assert out["status"] == "incomplete" and out["incomplete"] == "max_output_tokens"
    assert turns.state is not None and not set(turns.state.tokens) & {loaded[1].token_id(t) for t in SLOT_TOKENS}, \
        "no fact slot: none was given"
    assert out["usage"] == {"input": out["usage"]["prefill"], "cached": 0, "prefill": out["usage"]["prefill"],
                            "output": 3}
    # a question, with no tool given: the model would start a lookup ("<call>metric(...", sent to the client)
    asked = LocalTurns(*loaded)
    out = responses.run(asked, ResponseSpec.model_validate(
        {"mode": "text", "text": "What was revenue in EMEA in 2026-Q3?\n", "params": {"max_new_tokens": 16}}))
    markup = {loaded[1].token_id(t) for t in (CALL, END_CALL, RESULT, END_RESULT, *SLOT_TOKENS)}
    assert asked.state is not None and not set(asked.state.tokens) & markup, out["output"]


WEATHER: dict[str, Any] = {"type": "function", "name": "get_weather", "description": "Get the current weather",
                           "parameters": {"type": "object", "required": ["location"],
                                          "properties": {"location": {"type": "string"}}}}


@pytest.mark.parametrize("question, force", [
    ("What's the weather like in San Francisco?", None),  # its lookup habit wrote metric(3 names): not offered
    ("Use the weather tool to get the temperature in San Francisco.", "calc"),  # forced: it wrote calc(3 names)
])
def test_a_function_of_one_string_is_called_with_its_one_argument(loaded: tuple[SetDLM, Tokenizer], question: str,
                                                                  force: str | None) -> None:
    """The Open Responses suite's weather tool (one required string: the calculator's skill by
    its shape): the call names the one tool offered and has its one argument, so it reaches the
    client as a function_call (it ended with no answer, and with a refused call, before)."""
    out = responses.run(LocalTurns(*loaded), ResponseSpec.model_validate(
        {"mode": "agent", "functions": [WEATHER], "question": question, **({"force": force} if force else {})}))
    [item] = out["output"]
    assert item["type"] == "function_call" and item["name"] == "get_weather", out
    assert json.loads(item["arguments"]) == {"location": "San Francisco"} and out["status"] == "completed"


LOOKUP_USER: dict[str, Any] = {"type": "function", "name": "lookup_user", "parameters": {
    "type": "object", "required": ["email"], "properties": {"email": {"type": "string"}}}}


@pytest.mark.parametrize("function, question, argument, output", [
    (WEATHER, "Use the weather tool to get the temperature in San Francisco.", "San Francisco", "64 degrees and clear"),
    (WEATHER, "What's the weather like in San Francisco?", "San Francisco", "Sunny, 18 C"),
    (WEATHER, "What will the weather be in San Francisco in 3 days?", "San Francisco", "rain"),  # a number, no arithmetic
    (LOOKUP_USER, "Who is ann@example.com?", "ann@example.com", "Ann Lee, admin since 2019"),
])
def test_a_function_of_one_text_is_called_with_the_questions_name_and_its_words_are_quoted(
        loaded: tuple[SetDLM, Tokenizer], function: dict[str, Any], question: str, argument: str, output: str) -> None:
    """A declared function of one string whose output is words (not a number): its argument is
    the name the question writes (the guide, text_arguments), and the answer quotes the output
    as its slot, which the runtime writes back: verified, the words as the client sent them."""
    conv = LocalTurns(*loaded)
    first = responses.run(conv, ResponseSpec.model_validate({"mode": "agent", "functions": [function], "question": question}))
    [call] = first["output"]
    assert call["type"] == "function_call" and list(json.loads(call["arguments"]).values()) == [argument], first
    second = responses.run(conv, ResponseSpec.model_validate(
        {"mode": "agent", "functions": [function], "parked": first["parked"], "output": output}))
    [message] = second["output"]
    assert second["status"] == "completed" and second["verified"] is True, second
    assert message["text"] == f"The result is {output}.", message


# functions of several parameters, filled from the question but the one text the model writes
# (domain/arguments.py); the questions are this test's own, no training template's
WEATHER_UNIT: dict[str, Any] = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "required": ["city", "unit"], "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}}}
FORECAST: dict[str, Any] = {"type": "function", "name": "get_forecast", "parameters": {
    "type": "object", "required": ["city", "days"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "alerts": {"type": "boolean"}}}}
FLIGHTS: dict[str, Any] = {"type": "function", "name": "find_flights", "parameters": {
    "type": "object", "required": ["origin", "destination"], "properties": {
        "origin": {"type": "string", "pattern": "^[A-Z]{3}$"}, "destination": {"type": "string"},
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}, "max_stops": {"type": "integer"}}}}
# no string at all: the model writes the text of a required value ("10", "true", "Paris, Rome")
FIB: dict[str, Any] = {"type": "function", "name": "get_fibonacci", "parameters": {
    "type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "minimum": 0}}}}
LIGHTS: dict[str, Any] = {"type": "function", "name": "toggle_lights", "parameters": {
    "type": "object", "required": ["on"], "properties": {"on": {"type": "boolean"}}}}
CITIES: dict[str, Any] = {"type": "function", "name": "compare_cities", "parameters": {
    "type": "object", "required": ["cities"], "properties": {"cities": {"type": "array", "items": {"type": "string"}}}}}
EVENT: dict[str, Any] = {"type": "function", "name": "create_event", "parameters": {
    "type": "object", "required": ["event"], "properties": {"event": {"type": "object", "properties": {
        "title": {"type": "string"}}}}}}


@pytest.mark.parametrize("function, question, arguments, output, resent", [
    (WEATHER_UNIT, "What's the weather in Paris in °F?", {"city": "Paris", "unit": "f"}, "72 and sunny", True),
    (WEATHER_UNIT, "Weather for San Francisco, in C please.", {"city": "San Francisco", "unit": "c"}, "18", True),
    (FORECAST, "Will it rain in Oslo over the next 3 days?", {"city": "Oslo", "days": 3}, "rain, then snow", True),
    (FORECAST, "Forecast for Oslo, days=5, alerts=true", {"city": "Oslo", "days": 5, "alerts": True}, "snow", False),
    (FLIGHTS, "Find flights from SFO to Berlin on 2027-01-15 with 1 max stops.",
     {"origin": "SFO", "destination": "Berlin", "date": "2027-01-15", "max_stops": 1}, "3 flights, from 412 USD", True),
    (FIB, "What is the 10th Fibonacci number?", {"n": 10}, "55", True),
    (LIGHTS, "Please switch the lights off.", {"on": False}, "lights are off", False),
    (CITIES, "Compare Paris and Rome", {"cities": ["Paris", "Rome"]}, "Rome is warmer", True),
])
def test_a_function_of_several_parameters_is_called_with_the_questions_values_and_its_output_quoted(
        loaded: tuple[SetDLM, Tokenizer], function: dict[str, Any], question: str, arguments: dict[str, Any],
        output: str, resent: bool) -> None:
    """Each argument is what the question writes for it, typed as the schema types it (an
    integer, a boolean, an enum's own value), and the optional ones it does not give are left
    out; the output, words or a number, is quoted by a verified answer, also where the tools
    are not sent again with it (the Open Responses suite's way: what the call may take is kept
    with the parked state)."""
    conv = LocalTurns(*loaded)
    first = responses.run(conv, ResponseSpec.model_validate({"mode": "agent", "functions": [function], "question": question}))
    [call] = first["output"]
    assert call["type"] == "function_call" and call["name"] == function["name"], first
    assert json.loads(call["arguments"]) == arguments
    second = responses.run(conv, ResponseSpec.model_validate(
        {"mode": "agent", "functions": [function] if resent else [], "parked": first["parked"], "output": output}))
    [message] = second["output"]
    assert second["status"] == "completed" and second["verified"] is True, second
    assert message["text"] == f"The result is {output}.", message


def test_a_lookup_with_an_optional_parameter_gets_it_only_where_its_question_gives_it(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    """The README's get_metric with an optional `decimals`: the model writes the three names, the
    question fills `decimals` where it writes it beside its name, and leaves it out where not
    (never a default made up); the answer as the lookup's."""
    rounded = {**GET_METRIC, "parameters": {**GET_METRIC["parameters"], "properties": {
        **GET_METRIC["parameters"]["properties"], "decimals": {"type": "integer", "minimum": 0, "maximum": 4}}}}
    conv = LocalTurns(*loaded)
    first = responses.run(conv, ResponseSpec.model_validate({"mode": "agent", "functions": [rounded], "question": README_QUESTION}))
    [call] = first["output"]
    assert json.loads(call["arguments"]) == {"metric": "churn", "region": "APAC", "period": "2026-Q3"}
    second = responses.run(conv, ResponseSpec.model_validate(
        {"mode": "agent", "functions": [rounded], "parked": first["parked"], "output": "2.7"}))
    assert second["verified"] is True and second["output"][0]["text"] == "churn in APAC in 2026-Q3 was 2.7."
    asked = responses.run(LocalTurns(*loaded), ResponseSpec.model_validate(
        {"mode": "agent", "functions": [rounded], "question": "What was churn in APAC in 2026-Q3, to 2 decimals?"}))
    [call] = asked["output"]
    assert json.loads(call["arguments"]) == {"metric": "churn", "region": "APAC", "period": "2026-Q3", "decimals": 2}


@pytest.mark.parametrize("function, question, force, why", [
    (WEATHER_UNIT, "What's the weather in Paris?", None, "get_weather: unit: the question writes none of its values"),
    (WEATHER_UNIT, "What's the weather in Paris in C or F?", "calc", "get_weather: unit: the question writes 2"),
    (FORECAST, "Will it rain in Oslo for my 3 guests?", None, "get_forecast: days: the question writes no number"),
    (FLIGHTS, "Find flights to Berlin on 2027-01-15.", None, "find_flights: origin: the question writes no name"),
    (FIB, "What is a Fibonacci number?", None, "get_fibonacci: n: the question writes no number"),
    (LIGHTS, "Don't turn the lights on.", "calc", "toggle_lights: on: the question says not to"),
    (CITIES, "Compare Paris with Rome in July", None, "compare_cities: cities: the question's names"),
    (EVENT, "Create an event called Launch in Paris.", None, "create_event: event: an object is not filled"),
])
def test_a_function_whose_values_the_question_does_not_give_is_not_called_and_the_response_says_why(
        loaded: tuple[SetDLM, Tokenizer], function: dict[str, Any], question: str, force: str | None, why: str) -> None:
    """No call with a value made up: the response fails at once (nothing decoded), naming what
    the question leaves out; forced by tool_choice too."""
    conv = LocalTurns(*loaded)
    with pytest.raises(NoAnswer) as e:
        responses.run(conv, ResponseSpec.model_validate(
            {"mode": "agent", "functions": [function], "question": question, **({"force": force} if force else {})}))
    assert e.value.code == "no_answer" and why in e.value.message and f"not called: {why}" in e.value.problems[0]
    assert conv.state is None, "nothing decoded"


@pytest.mark.parametrize("text", [
    "You are a pirate. Always respond in pirate speak.\nSay hello.\n",  # outside its use cases: it never ends these
    "My name is Alice.\nHello Alice! Nice to meet you. How can I help you today?\nWhat is my name?\n",
])
def test_a_text_response_ends_its_text_within_the_kinds_own_limit(loaded: tuple[SetDLM, Tokenizer], text: str) -> None:
    out = responses.run(LocalTurns(*loaded), ResponseSpec.model_validate({"mode": "text", "text": text}))
    assert out["status"] == "completed" and out["incomplete"] is None, out
    assert out["usage"]["output"] <= responses.TEXT_LIMIT == 256


@pytest.mark.parametrize("bad", [
    {"mode": "agent"},  # neither a question nor a parked call
    {"mode": "text"},
    {"mode": "agent", "question": "What [F1]?"},  # the agent's rules
    {"mode": "agent", "question": "What?", "functions": [{"type": "function", "name": "f",
                                                          "parameters": {"type": "object", "required": 3}}]}])
def test_bad_specs_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ResponseSpec.model_validate(bad)


def test_only_functions_of_three_or_one_required_strings_fit_a_skill() -> None:
    spec = ResponseSpec.model_validate({"mode": "agent", "question": "What?", "functions": [
        UNRELATED, LOOKUP, {**LOOKUP, "name": "second_lookup"},
        {"type": "function", "name": "calc", "parameters": {"type": "object", "required": ["e"],
                                                             "properties": {"e": {"type": "string"}}}}]})
    assert {k: f.name for k, f in spec.callable().items()} == {"metric": "get_kpi", "calc": "calc"}
    assert DATA.seed == 2026  # the sample dataset the outputs above come from


def test_a_function_filled_from_its_question_takes_calcs_shape_and_a_lookup_may_have_optional_parameters() -> None:
    def skill(parameters: dict[str, Any]) -> str | None:
        return ResponseSpec.model_validate({"mode": "agent", "question": "What?", "functions": [
            {"type": "function", "name": "f", "parameters": parameters}]}).functions[0].skill()

    props = GET_METRIC["parameters"]["properties"]
    assert skill(WEATHER_UNIT["parameters"]) == skill(FORECAST["parameters"]) == skill(FLIGHTS["parameters"]) == "calc"
    assert skill({**GET_METRIC["parameters"], "properties": {**props, "unit": {"type": "string", "enum": ["%", "pp"]}}}) \
        == "metric"  # its three names the model's, `unit` the question's
    assert skill({**GET_METRIC["parameters"], "properties": {**props, "tags": {"type": "array"}}}) is None
    assert skill(UNRELATED["parameters"]) is None  # nothing required: no call a question asks for
    assert skill(FIB["parameters"]) == skill(LIGHTS["parameters"]) == skill(CITIES["parameters"]) == "calc"
    assert skill(EVENT["parameters"]) is None


def test_the_built_in_tools_run_here_as_the_native_agents_do(loaded: tuple[SetDLM, Tokenizer]) -> None:
    out = responses.run(LocalTurns(*loaded), ResponseSpec.model_validate(
        {"mode": "agent", "question": QUESTION, "builtin": ["metric", "calc"]}))
    native = agent.run(LocalTurns(*loaded), AgentSpec(question=QUESTION))
    [message] = out["output"]
    assert message["text"] == native["answer"] and ANSWER in message["text"] and out["verified"] is True
    assert [c["by"] for c in out["calls"]] == ["server"] * 3


def test_a_lookup_nobody_offered_is_answered_with_an_error_never_from_the_sample_dataset(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    calc = {"type": "function", "name": "calculate", "parameters": {
        "type": "object", "required": ["expression"], "properties": {"expression": {"type": "string"}}}}
    spec = ResponseSpec.model_validate({"mode": "agent", "question": QUESTION, "functions": [calc], "max_calls": 2,
                                        "allow_unverified": True})
    assert spec.offered() == ["calc"]
    try:
        out = responses.run(LocalTurns(*loaded), spec)
    except NoAnswer:
        return  # no answer, and none from data nobody gave
    # its calls name a tool offered (the guide: tools.call_form); one that named the lookup
    # anyway would be answered with the error (agent._run_call), never from the sample dataset
    assert all(c["tool"] == "calc" for c in out["calls"]), out["calls"]


@pytest.mark.parametrize("question, outputs, answer", [
    ("How much higher was revenue in EMEA than in APAC in 2026-Q3?", {"EMEA": "512", "APAC": "468"},
     "revenue in EMEA was 44 higher than in APAC."),
    ("What was the total revenue across EMEA and APAC in 2026-Q3?", {"EMEA": "512", "APAC": "468"},
     "Total revenue across EMEA and APAC in 2026-Q3 was 980.")])
def test_a_lookup_with_no_enum_for_its_period_answers_two_row_questions(loaded: tuple[SetDLM, Tokenizer], question: str,
                                                                       outputs: dict[str, str], answer: str) -> None:
    """The README's get_kpi lists no `quarter` values: the question's period was no slot, the
    model miscopied it in its second call ("[F17]026-Q3") and the response failed no_answer.
    A period in a common form is now a name the calls copy."""
    conv = LocalTurns(*loaded)
    out = respond(conv, question=question)
    for _ in range(3):
        [item] = out["output"]
        if item["type"] != "function_call":
            break
        args = json.loads(item["arguments"])
        assert args["quarter"] == "2026-Q3", args
        out = respond(conv, parked=out["parked"], output=outputs[args["market"]])
    assert out["verified"] is True and out["output"][0]["text"].endswith(answer), out["output"]


class Written(LocalTurns):
    """A session in this process that keeps what each turn wrote, as text."""

    def __init__(self, loaded: tuple[SetDLM, Tokenizer]) -> None:
        super().__init__(*loaded)
        self.written: list[str] = []

    def turn(self, ids: list[int], params: Any, **kw: Any) -> Any:
        r = super().turn(ids, params, **kw)
        self.written.append(self.tokenizer.decode(r.tokens))
        return r


@pytest.mark.parametrize("force, head", [("metric", f"{CALL}metric("), ("any", CALL)])
def test_a_forced_call_is_how_the_first_segment_begins(loaded: tuple[SetDLM, Tokenizer], force: str, head: str) -> None:
    """tool_choice `required` or a named function (ResponseSpec.force): the first segment opens
    the call, where the model left to itself writes none (a statement, not a question)."""
    statement = "Revenue in EMEA rose in 2026-Q3."
    free, forced = Written(loaded), Written(loaded)
    for turns, f in ((free, None), (forced, force)):
        try:
            responses.run(turns, ResponseSpec.model_validate({"mode": "agent", "functions": [LOOKUP],
                                                              "question": statement, "force": f}))
        except NoAnswer:
            pass  # what the model makes of a statement is not this test's
    assert not free.written[0].startswith(CALL), free.written[0]
    assert forced.written[0].startswith(head), forced.written[0]


@pytest.mark.parametrize("function, question, output, answer", [
    (LOOKUP, "What was revenue in EMEA in 2026-Q2?", "not reported yet", "revenue in EMEA in 2026-Q2 was not reported yet."),
    (GET_METRIC, README_QUESTION, "about 2.7 percent", "churn in APAC in 2026-Q3 was about 2.7 percent."),
])
def test_a_lookups_output_in_words_is_quoted_in_its_answer_form(loaded: tuple[SetDLM, Tokenizer], function: dict[str, Any],
                                                                 question: str, output: str, answer: str) -> None:
    """A function of three names whose output is words: the lookup's answer form, its number the
    words' slot (its unit none: the words are the tool's, whole)."""
    conv = LocalTurns(*loaded)
    first = responses.run(conv, ResponseSpec.model_validate({"mode": "agent", "functions": [function], "question": question}))
    [call] = first["output"]
    assert call["type"] == "function_call", first
    second = responses.run(conv, ResponseSpec.model_validate(
        {"mode": "agent", "functions": [function], "parked": first["parked"], "output": output}))
    assert second["verified"] is True and second["output"][0]["text"] == answer, second
