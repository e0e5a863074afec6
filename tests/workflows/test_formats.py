"""A `format` on the native narrative and agent jobs (issue 53): checked at submission as the
Responses API checks text.format; the job writes its text (checked as before), then its JSON
document under the format's grammar: valid against the schema, its numbers those the text
states, or the job fails with a clear code (never a wrong success)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from domain.payload import Metric, Payload
from runtime.errors import BadInput, Unfinished, Unverified
from runtime.jobs.kinds import check_spec
from runtime.jobs.params import ParamsSpec
from runtime.jobs.payload import PayloadSpec
from runtime.jobs.specs import AgentSpec, NarrativeSpec
from runtime.sessions.local import LocalTurns
from workflows import agent, narrative, structured
from workflows.structured import Format

from .test_agent import DATA, QUESTION

PAYLOAD = Payload("Globex", "2026-Q3", "brief", [Metric("revenue", "1240", "1105", "1300")])
WORDS = {"type": "json_schema", "name": "brief", "strict": True, "schema": {
    "type": "object", "properties": {"headline": {"type": "string", "maxLength": 40},
                                     "direction": {"type": "string", "enum": ["up", "down", "flat"]}},
    "required": ["headline", "direction"], "additionalProperties": False}}
NUMBERS = {"type": "json_schema", "name": "figures", "schema": {
    "type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"], "additionalProperties": False}}


def test_a_format_is_checked_at_submission_with_the_responses_apis_reasons() -> None:
    for kind, spec in (("narrative", {"payload": PayloadSpec.of(PAYLOAD).model_dump()}),
                       ("agent", {"question": "What was revenue in EMEA?"})):
        assert check_spec(kind, {**spec, "format": WORDS}, "new").format == WORDS  # type: ignore[attr-defined]
        assert check_spec(kind, {**spec, "format": {"type": "json_object"}}, "new").format  # type: ignore[attr-defined]
        assert check_spec(kind, spec, "new").format is None  # type: ignore[attr-defined]
        refused = {"backreferences": {"type": "json_schema", "schema": {"type": "string", "pattern": "(a)\\1"}},
                   "needs its `schema`": {"type": "json_schema"},
                   "type is text, json_schema or json_object": {"type": "grammar"}}
        for why, fmt in refused.items():
            with pytest.raises(BadInput, match=f"format.*{why.replace('`', '.')}"):
                check_spec(kind, {**spec, "format": fmt}, "new")


def test_a_narrative_writes_its_document_after_its_checked_text(session: Callable[[], LocalTurns]) -> None:
    spec = NarrativeSpec(payload=PayloadSpec.of(PAYLOAD), format=WORDS,
                         params=ParamsSpec(policy="prefix", window=8, tau=0.99, max_new_tokens=200))
    r = narrative.run(session(), spec)
    assert r["verified"] and r["facts_ok"] == r["facts_total"] > 0, r["text"]
    doc = r["document"]
    assert set(doc) == {"headline", "direction"} and doc["direction"] in ("up", "down", "flat")
    assert len(doc["headline"]) <= 40
    plain = NarrativeSpec(payload=PayloadSpec.of(PAYLOAD), params=spec.params)
    assert narrative.run(session(), plain)["text"] == r["text"], "the text is the same with a format or without"


@pytest.mark.parametrize("policy", ["ar", "set"])
def test_an_agents_document_is_valid_and_states_only_numbers_its_text_does(session: Callable[[], LocalTurns],
                                                                           policy: str) -> None:
    """The agent test's question and dataset (tests/workflows/test_agent.py): its answer checked
    as before, then its document; one of words is a success, one of a number is a success only
    where the number is one the transcript states (a call's result), else it fails unverified."""
    params = ParamsSpec.model_validate({"policy": policy, "window": 4, "tau": 0.9, "max_new_tokens": 96})
    for fmt in (WORDS, NUMBERS):
        spec = AgentSpec(question=QUESTION, dataset_seed=DATA.seed, params=params, format=fmt)
        try:
            r = agent.run(session(), spec)
        except (Unverified, Unfinished) as e:
            assert fmt is NUMBERS and e.code == "unverified" and "not in the text" in e.problems[0], e
            continue
        assert r["verified"] and r["reason"] == "answer", r["text"]
        doc = r["document"]
        structured.document(json.dumps(doc, separators=(",", ":")), Format.of(fmt), ended=True)  # type: ignore[arg-type]
        stated = {float(n) for n in structured.NUMBER.findall(r["text"].replace(",", ""))}
        assert all(float(n) in stated for n in structured._numbers(doc)), (doc, r["text"])
        assert fmt is NUMBERS or doc["direction"] in ("up", "down", "flat")


def test_a_document_that_states_a_number_its_text_does_not_fails_unverified() -> None:
    assert structured._numbers({"a": [1, 2.5, True, None, {"b": -3}], "c": "4"}) == [1, 2.5, -3]


def test_a_narratives_plan_holds_its_documents_turn(session: Callable[[], LocalTurns]) -> None:
    t = session()
    plain = NarrativeSpec(payload=PayloadSpec.of(PAYLOAD))
    with_doc = NarrativeSpec(payload=PayloadSpec.of(PAYLOAD), format=WORDS)
    extra = narrative.planned(with_doc, t.tokenizer) - narrative.planned(plain, t.tokenizer)
    assert extra >= structured.DOCUMENT_TOKENS
