"""The API's payload grammar and the corpus's agree (domain/narrative.py wild_payload,
runtime/jobs/specs.py PayloadSpec), and the checker reads any payload the grammar allows: names
with digits and the checker's own words, 1- and 40-character names, 9-digit numbers with 3
decimals, custom metrics."""

from __future__ import annotations

import random
import re

import pytest

from domain import narrative as corpus
from domain.narrative import Breakdown, Metric, Payload
from runtime.errors import BadInput
from runtime.jobs.specs import AgentSpec, PayloadSpec, SectionSpec, check_spec

# payloads at the grammar's edges, each valid for the API
EDGES = [
    Payload("3M", "1", "formal", [Metric("revenue", "0", "999999999.999", "1")],
            Breakdown("region", "revenue", [("rose", "5", "4"), ("A", "12.5", "12.5"), ("5", "1", "2"),
                                            ("x" * 40, "123456789", "123456789.001")])),
    Payload("Up & Down Ltd.", "2027-H1", "casual",
            [Metric("Tickets per agent", "41", "38", "40", custom_unit="tickets"),
             Metric("NPS", "7.125", "7.5", custom_unit="points"), Metric("churn", "2.4", "2.4", "2.4")]),
    Payload("Z", "FY27-Q0-x", "brief",
            [Metric("Above target", "10", "9", "11", custom_unit="above"),
             Metric("Conversion rate 2", "1.5", "1.25", custom_unit="%")],
            Breakdown("segment", "Above target", [("North", "3", "2"), ("North East", "7", "7")])),
]


def test_every_wild_payload_is_one_the_api_accepts_and_reads_back_the_same() -> None:
    for seed in range(400):
        p = corpus.wild_payload(random.Random(seed))
        assert corpus.valid(p) is None
        assert PayloadSpec.of(p).to_payload() == p  # the API's form of it is the same payload


@pytest.mark.parametrize("p", EDGES, ids=["digits-and-words", "custom", "overlapping-names"])
def test_a_payload_the_api_accepts_is_inside_the_grammar_and_its_narratives_check(p: Payload) -> None:
    spec = PayloadSpec.of(p)  # accepted by the API ...
    assert corpus.valid(spec.to_payload()) is None  # ... and inside the corpus's grammar
    for seed in range(30):  # every phrasing the generator has reads back fully correct
        c = corpus.check(p, corpus.narrative(random.Random(seed), p))
        assert c.fully_correct and c.facts_ok == c.facts_total, c.problems


@pytest.mark.parametrize("p", EDGES, ids=["digits-and-words", "custom", "overlapping-names"])
def test_the_checker_refutes_a_wrong_number_a_wrong_word_and_a_missing_row(p: Payload) -> None:
    text = corpus.narrative(random.Random(0), p)
    last = p.facts()[-1]
    wrong_number = text[::-1].replace(last.numbers[-1][::-1], "7" + last.numbers[-1][::-1], 1)[::-1]
    assert not corpus.check(p, wrong_number).fully_correct
    swapped = text
    for word, other in (("rose", "fell"), ("fell", "rose"), ("held flat", "rose"), ("was unchanged", "fell"),
                        ("stayed level", "fell"), ("increased", "decreased"), ("decreased", "increased"),
                        ("climbed", "dropped"), ("dropped", "climbed"), ("grew", "declined"), ("declined", "grew")):
        if re.search(rf" {word}\b", text):
            swapped = re.sub(rf" {word}\b", f" {other}", text, count=1)
            break
    assert swapped != text and not corpus.check(p, swapped).fully_correct
    if p.breakdown is not None:
        name = p.breakdown.rows[-1][0]
        cut = text[: text.rindex(name)].rstrip(" ,and")
        c = corpus.check(p, cut)
        assert f"{name!r} not mentioned" in c.problems


@pytest.mark.parametrize("bad, why", [
    ({"tenant": "x" * 41}, "tenant"),
    ({"period": "2026 Q3"}, "period"),
    ({"metrics": [{"key": "revenue", "value": "1234567890", "prev": "1"}]}, "value"),
    ({"metrics": [{"key": "revenue", "value": "1.2345", "prev": "1"}]}, "value"),
    ({"metrics": [{"name": "NPS", "unit": "per 100", "value": "1", "prev": "1"}]}, "unit"),
    ({"metrics": [{"name": "NPS", "value": "1", "prev": "1"}]}, "name"),
    ({"metrics": [{"key": "revenue", "name": "NPS", "unit": "x", "value": "1", "prev": "1"}]}, "custom"),
    ({"metrics": [{"name": "Revenue", "unit": "x", "value": "1", "prev": "1"},
                  {"key": "revenue", "value": "1", "prev": "1"}]}, "named twice"),
    ({"breakdown": {"kind": "region", "metric": "revenue", "rows": [["EMEA", "1", "2"], ["EMEA", "3", "4"]]}},
     "named twice"),
])
def test_the_api_refuses_what_is_outside_the_grammar(bad: dict[str, object], why: str) -> None:
    payload = {"tenant": "Acme", "period": "2026-Q3", "metrics": [{"key": "revenue", "value": "1", "prev": "2"}],
               **bad}
    with pytest.raises(BadInput, match=why):
        check_spec("narrative", {"payload": payload}, "s1")


def test_the_api_passes_names_on_canonical_and_refuses_two_that_are_then_one() -> None:
    """Spaces at a name's ends dropped, runs inside made one (corpus.canonical): what the model
    writes and the checker reads; the generator draws names so."""
    payload = {"tenant": "Acme  Corp ", "period": "FY27",
               "metrics": [{"name": "Net  revenue ", "unit": "k  USD", "value": "1", "prev": "2"}],
               "breakdown": {"kind": "region", "metric": "Net revenue  ", "rows": [["North  America ", "1", "2"]]}}
    p = PayloadSpec.model_validate(payload).to_payload()
    assert (p.tenant, p.metrics[0].key, p.metrics[0].unit) == ("Acme Corp", "Net revenue", "k USD")
    assert p.breakdown is not None and (p.breakdown.metric, p.breakdown.rows[0][0]) == ("Net revenue", "North America")
    assert corpus.valid(p) is None
    assert SectionSpec(title="Revenue", metrics=["Net  revenue "]).metrics == ["Net revenue"]  # as the data names it
    twice = {**payload, "breakdown": {**payload["breakdown"], "rows": [["EMEA", "1", "2"], ["EMEA ", "3", "4"]]}}
    with pytest.raises(BadInput, match="named twice"):
        check_spec("narrative", {"payload": twice}, "s1")
    for seed in range(400):
        rng = random.Random(seed)
        assert all(corpus.canonical(n) == n for n in (corpus.wild_name(rng), corpus.wild_unit(rng)))


def test_an_agent_question_is_passed_on_canonical() -> None:
    assert AgentSpec(question="What was x  in uLX  in 2026? ").question == "What was x in uLX in 2026?"
    assert AgentSpec(question="S\u00e3o\u00a0Paulo\u2028 x").question == "S\u00e3o\u00a0Paulo\u2028 x"  # only U+0020
    with pytest.raises(ValueError, match="more than spaces"):
        AgentSpec(question="   ")


def test_every_wild_agent_question_is_one_the_api_accepts_and_its_tools_answer_as_a_tenants_dataset() -> None:
    from domain import agent
    from workflows import tools

    for seed in range(300):
        task, store, pieces = agent.wild_example(random.Random(seed))
        AgentSpec(question=task.question, dataset="d")  # the API takes the question as it is
        table = tools.Table.of("d", [[*k, v] for k, v in store.values.items()])
        for call in task.calls:  # the runtime's tools read the store as a tenant's dataset: what training gave
            r = tools.run_call(call, table if call.startswith("metric") else store)
            assert r.ok and r.result == agent.run_call(call, store), call
            args = re.findall(r'"([^"]*)"', call)
            assert call.startswith("calc") or all(a in task.question for a in args), "the call copies the question"
        text = "".join(t for t, _ in pieces)
        assert agent.check(task, text).answer_ok, text  # names with digits are not read as the answer
