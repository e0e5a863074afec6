"""Structured output through the Responses API, against real worker processes, a real Redis and
SQLite (app.demo.Stack), driven by the clients that ask for it: the official `openai` SDK's
text.format json_schema (responses.parse with a pydantic model, and a raw schema with strict)
and json_object, and openai-agents' output_type.  Every document that comes back as a success is
valid against its schema (checked here again, by jsonschema); one the token limit cut fails with
unfinished_document; a schema setflow does not take is refused at submission, with its reason,
and changes nothing.

The shipped model is small and was trained on narratives and agent calls, not JSON: what it
writes in a string or a number is its own (often nonsense).  Values are asserted only where the
schema fixes them (an enum, a bound, a const); validity always."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest

from app.demo import Stack
from tests.runtime.api import test_responses as base
from tests.runtime.api.test_responses import KEY

pytestmark = pytest.mark.slow
stack = base.stack  # test_responses.py's stack (its own, for this module)
QUESTION = "Which region grew the most in 2025-Q4, and by how much?"
GROWTH: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["region", "direction", "share", "rank", "note"],
    "properties": {"region": {"type": "string", "enum": ["AMER", "EMEA", "APAC", "LATAM"]},
                   "direction": {"type": "string", "enum": ["up", "down"]},
                   "share": {"type": "number", "minimum": 0, "maximum": 1},
                   "rank": {"type": "integer", "minimum": 1, "maximum": 4},
                   "note": {"type": "string", "maxLength": 40},
                   "source": {"type": "string", "const": "setflow"}}}


class Growth(pydantic.BaseModel):
    """What a client's pydantic model asks for (responses.parse, openai-agents' output_type)."""

    region: Literal["AMER", "EMEA", "APAC", "LATAM"]
    direction: Literal["up", "down"]
    rank: int
    note: str


@pytest.fixture()
def sdk(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(api_key=KEY, base_url=stack.api.url + "/v1", max_retries=0, timeout=120) as c:
        yield c


@pytest.mark.parametrize("policy", ["prefix", "set", "ar"])
def test_a_json_schema_response_is_a_document_valid_against_it(sdk: openai.OpenAI, policy: str) -> None:
    fmt = {"type": "json_schema", "name": "growth", "schema": GROWTH, "strict": True}
    r = sdk.responses.create(model="small", input=QUESTION, text={"format": fmt},  # type: ignore[arg-type]
                             extra_body={"setflow": {"policy": policy, "window": 4 if policy != "ar" else 1,
                                                     "tau": 0.9 if policy != "ar" else None}})
    assert r.status == "completed", r.error
    doc = json.loads(r.output_text)
    jsonschema.validate(doc, GROWTH)
    assert doc["region"] in ("AMER", "EMEA", "APAC", "LATAM") and 0 <= doc["share"] <= 1 and 1 <= doc["rank"] <= 4
    assert doc.get("source", "setflow") == "setflow"
    assert r.text.format.type == "json_schema" and r.text.format.name == "growth"  # type: ignore[union-attr]


def test_the_sdks_parse_gives_the_clients_pydantic_model(sdk: openai.OpenAI) -> None:
    r = sdk.responses.parse(model="small", input=QUESTION, text_format=Growth)
    assert r.status == "completed", r.error
    parsed = r.output_parsed
    assert isinstance(parsed, Growth) and parsed.region in ("AMER", "EMEA", "APAC", "LATAM")


def test_json_object_is_a_json_object(sdk: openai.OpenAI) -> None:
    """Held to a small object (workflows/structured/ ANY_OBJECT), so that it closes in time."""
    r = sdk.responses.create(model="small", input="Describe EMEA's revenue as JSON.", text={"format": {"type": "json_object"}})
    assert r.status == "completed", r.error
    doc = json.loads(r.output_text)
    assert isinstance(doc, dict) and len(doc) <= 4


def test_a_document_the_limit_cuts_fails_and_is_never_a_success(sdk: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "name": "growth", "schema": GROWTH, "strict": True}
    r = sdk.responses.create(model="small", input=QUESTION, text={"format": fmt}, max_output_tokens=6)  # type: ignore[arg-type]
    assert r.status == "failed" and r.error is not None
    assert r.error.code == "unfinished_document", r.error  # type: ignore[comparison-overlap]
    assert "token limit" in r.error.message and r.output == []


@pytest.mark.parametrize("fmt, why", [
    ({"type": "json_schema", "name": "x", "schema": {"$ref": "https://example.com/schema.json"}}, "points outside the document"),
    ({"type": "json_schema", "name": "x", "schema": {"type": "string", "pattern": "(a)\\1"}}, "RE2"),
    ({"type": "json_schema", "name": "x", "schema": {"type": "object", "description": "x" * 70_000}}, "bytes as JSON"),
    ({"type": "json_schema", "name": "x"}, "needs its `schema`"),
    ({"type": "grammar", "syntax": "lark", "definition": "start: /a+/"}, "text, json_schema or json_object"),
])
def test_a_schema_setflow_does_not_take_is_refused_with_its_reason(sdk: openai.OpenAI, fmt: dict[str, Any], why: str) -> None:
    before = sdk.get("/jobs", cast_to=httpx.Response).json()["jobs"]
    with pytest.raises(openai.BadRequestError) as e:
        sdk.responses.create(model="small", input=QUESTION, text={"format": fmt})  # type: ignore[arg-type]
    assert why in str(e.value.body)
    assert sdk.get("/jobs", cast_to=httpx.Response).json()["jobs"] == before


def test_a_json_answer_from_the_agent_is_refused_at_submission(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        sdk.responses.create(model="small", input="What was churn in EMEA in 2026-Q3?", tools=[{"type": "setflow_calc"}],  # type: ignore[list-item]
                             text={"format": {"type": "json_schema", "name": "growth", "schema": GROWTH}})  # type: ignore[arg-type]
    assert "without tools the model" in str(e.value.body)


def test_openai_agents_output_type_is_the_clients_model(stack: Stack) -> None:
    """openai-agents sends output_type's schema as text.format json_schema (strict) and parses the
    message into the client's model."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)

    async def run() -> Any:
        async with openai.AsyncOpenAI(api_key=KEY, base_url=stack.api.url + "/v1", max_retries=0) as client:
            model = agents.OpenAIResponsesModel(model="small", openai_client=client)
            return await agents.Runner.run(agents.Agent(name="analyst", instructions="Answer as the schema asks.",
                                                        output_type=Growth, model=model), QUESTION)

    result = asyncio.run(run())
    assert isinstance(result.final_output, Growth) and result.final_output.direction in ("up", "down")
    with openai.OpenAI(api_key=KEY, base_url=stack.api.url + "/v1", max_retries=0) as c:
        fmt = c.responses.retrieve(result.raw_responses[-1].response_id).text.format  # type: ignore[union-attr]
    assert fmt.type == "json_schema" and fmt.strict is True  # type: ignore[union-attr]


def test_langchain_with_structured_output_is_the_clients_model(stack: Stack) -> None:
    """LangChain's ChatOpenAI over the Responses API: with_structured_output(Growth) sends its
    schema as text.format json_schema (strict) and parses the message into the client's model."""
    lc = pytest.importorskip("langchain_openai", reason="langchain-openai is not installed (a dev dependency)")
    llm = lc.ChatOpenAI(model="small", api_key=KEY, base_url=stack.api.url + "/v1", use_responses_api=True,
                        max_retries=0, timeout=120)
    out = llm.with_structured_output(Growth, method="json_schema", strict=True, include_raw=True).invoke(QUESTION)
    assert out["parsing_error"] is None and isinstance(out["parsed"], Growth), out
    assert out["parsed"].region in ("AMER", "EMEA", "APAC", "LATAM") and out["parsed"].direction in ("up", "down")
    with openai.OpenAI(api_key=KEY, base_url=stack.api.url + "/v1", max_retries=0) as c:
        fmt = c.responses.retrieve(out["raw"].response_metadata["id"]).text.format  # type: ignore[union-attr]
    assert fmt.type == "json_schema" and fmt.strict is True  # type: ignore[union-attr]
