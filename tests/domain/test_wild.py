"""The API's payload grammar and the corpus's agree (domain/draws.py wild_payload and the
grammar's functions, runtime/jobs/specs.py PayloadSpec), and the checker reads any payload the
grammar allows: names in any script with digits, signs and the checker's own words, 1- and
80-character names, numbers of 15 significant digits or 6 decimals, negative ones, 8 metrics
and 12 rows, custom metrics."""

from __future__ import annotations

import random
import re
import unicodedata
from typing import Any

import pytest

from domain import narrative as corpus
from domain.draws import wild_name, wild_payload, wild_unit
from domain.grammar import MAX_METRICS, MAX_NAME, MAX_ROWS, canonical, valid
from domain.payload import METRIC, STYLES, Breakdown, Metric, Payload
from domain.tools import run_call
from runtime.errors import BadInput
from runtime.jobs.kinds import check_spec
from runtime.jobs.payload import PayloadSpec
from runtime.jobs.specs import AgentSpec, NarrativeSpec, ReportSpec, SectionSpec

# names in several scripts, with the signs a business name holds; each its own
SCRIPTS = ["Müller & Söhne GmbH", "株式会社ヤマダ", "الرياض", "Ελλάδα", "Москва-Сити", "서울 (본사)",
           "दिल्ली", "São Paulo | SP", "O'Brien \"Nord\" <B2B>", "Zürich 2", "תל אביב", "Café 50/50"]
# at the grammar's edges: MAX_METRICS metrics (custom ones in any script), MAX_ROWS rows, MAX_NAME
# characters, MAX_DIGITS significant digits, MAX_DECIMALS decimals, negative numbers
ANY_SCRIPT = Payload(
    "Ünïcødé Holding | 東京 (JP) <main>", "2026年 第3四半期", "formal",
    [Metric("revenue", "-123456789.123456", "123456789012345", "-0.000001"),
     Metric("Umsatz pro Kunde", "980", "1020.5", custom_unit="€/Kunde"),
     Metric("売上高", "-12.5", "-12.25", "-12.5", custom_unit="百万円"),
     Metric("صافي الربح", "0", "-7", custom_unit="ر.س"),
     Metric("churn", "2.4", "2.4"), Metric("Ø Bestellwert", "41", "38", "40", custom_unit="EUR"),
     Metric("n" * MAX_NAME, "1", "2", custom_unit="u" * MAX_NAME), Metric("orders", "7", "6")],
    Breakdown("segment", "Umsatz pro Kunde", [(n, str(i * 10 - 50), str(i * 7)) for i, n in enumerate(SCRIPTS)]))
EDGES = [
    Payload("3M", "1", "formal", [Metric("revenue", "0", "999999999.999", "1")],
            Breakdown("region", "revenue", [("rose", "5", "4"), ("A", "12.5", "12.5"), ("5", "1", "2"),
                                            ("x" * MAX_NAME, "123456789", "123456789.001")])),
    Payload("Up & Down Ltd.", "2027-H1", "casual",
            [Metric("Tickets per agent", "41", "38", "40", custom_unit="tickets"),
             Metric("NPS", "7.125", "7.5", custom_unit="points"), Metric("churn", "2.4", "2.4", "2.4")]),
    Payload("Z", "FY27-Q0-x", "brief",
            [Metric("Above target", "10", "9", "11", custom_unit="above"),
             Metric("Conversion rate 2", "1.5", "1.25", custom_unit="%")],
            Breakdown("segment", "Above target", [("North", "3", "2"), ("North East", "7", "7")])),
    ANY_SCRIPT,
]
IDS = ["digits-and-words", "custom", "overlapping-names", "any-script"]


def test_every_wild_payload_is_one_the_api_accepts_and_reads_back_the_same() -> None:
    for seed in range(400):
        p = wild_payload(random.Random(seed))
        assert valid(p) is None
        assert PayloadSpec.of(p).to_payload() == p  # the API's form of it is the same payload


@pytest.mark.parametrize("p", EDGES, ids=IDS)
def test_a_payload_the_api_accepts_is_inside_the_grammar_and_its_narratives_check(p: Payload) -> None:
    spec = PayloadSpec.of(p)  # accepted by the API ...
    assert valid(spec.to_payload()) is None  # ... and inside the corpus's grammar
    assert spec.to_payload() == p  # every name and number as given
    for seed in range(30):  # every phrasing the generator has reads back fully correct
        c = corpus.check(p, corpus.narrative(random.Random(seed), p))
        assert c.fully_correct and c.facts_ok == c.facts_total, c.problems


@pytest.mark.parametrize("p", EDGES, ids=IDS)
def test_the_checker_refutes_a_wrong_number_a_wrong_word_and_a_missing_row(p: Payload) -> None:
    text = corpus.narrative(random.Random(0), p)  # in slot form: each name and number a slot
    r = p.render()
    last, other = r.clauses[-1].numbers[-1], r.clauses[0].numbers[0]
    assert last != other
    wrong_number = text[: text.rindex(last)] + other + text[text.rindex(last) + len(last):]
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
        cut = text[: text.rindex(r.rows[-1].name)].rstrip(" ,and")
        c = corpus.check(p, cut)
        assert f"{name!r} not mentioned" in c.problems


def _metric(value: Any = "1", **more: Any) -> dict[str, Any]:
    return {"key": "revenue", "value": value, "prev": "2", **more}


def _rows(n: int) -> dict[str, Any]:
    return {"breakdown": {"kind": "region", "metric": "revenue", "rows": [[f"R{i}", "1", "2"] for i in range(n)]}}


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("a name of 81 characters", {"tenant": "x" * 81}, r"tenant: .*a name is 1-80 characters, got 81"),
    ("a row name of 81", {"breakdown": {"kind": "region", "metric": "revenue", "rows": [["é" * 81, 1, 2]]}},
     r"rows\.0\.0: .*1-80 characters"),
    ("a tab", {"period": "2026\tQ3"}, r"period: .*control .*U\+0009"),
    ("a line break", {"tenant": "Acme\nCorp"}, r"tenant: .*U\+000A"),
    ("a bidi override", {"tenant": "Acme\u202eproC"}, r"U\+202E"),
    ("a name of spaces", {"metrics": [_metric(name=" \u00a0 ", unit="x") | {"key": None}]}, "more than spaces"),
    ("an empty unit", {"metrics": [{"name": "NPS", "unit": "", "value": "1", "prev": "1"}]}, r"unit: .*more than spaces"),
    ("a control token", {"tenant": "Acme [MASK]"}, r"\[MASK\] is a control token"),
    ("markup", {"breakdown": {"kind": "region", "metric": "revenue", "rows": [["<call>x", "1", "2"]]}},
     "<call> is a control token"),
    ("a slot's text", {"period": "Q[F3]"}, r"\[F3\] is a fact slot"),
    ("a thousands separator", {"metrics": [_metric("1,240")]}, r"value: .*thousands separator.*like 1240"),
    ("a space separator", {"metrics": [_metric(target="1 240,5")]}, r"target: .*thousands separator.*like 1240\.5"),
    ("a decimal comma", {"metrics": [_metric("2,5")]}, r"decimal comma.*like 2\.5"),
    ("spaces around a number", {"metrics": [_metric(" 1240 ")]}, r"spaces around it.*like 1240"),
    ("16 significant digits", {"metrics": [_metric("1234567890123456")]}, r"value: .*15 significant digits, got 16"),
    ("a JSON number of 16", {"metrics": [_metric(1e16)]}, r"value: .*15 significant digits"),
    ("7 decimals", {"metrics": [_metric("1.2345678")]}, r"value: .*6 decimals, got 7"),
    ("an exponent", {"metrics": [_metric("1e3")]}, r"value: .*a number is digits"),
    ("a plus sign", {"metrics": [_metric("+5")]}, r"value: .*a number is digits"),
    ("true", {"metrics": [_metric(True)]}, r"value: .*a JSON number or a string"),
    ("null", {"metrics": [_metric(prev=None)]}, r"prev: .*a JSON number or a string"),
    ("NaN", {"metrics": [_metric(float("nan"))]}, r"value: .*finite"),
    ("infinity", {"metrics": [_metric(float("inf"))]}, r"value: .*finite"),
    ("9 metrics", {"metrics": [_metric(key=k) for k in list(METRIC)[:9]]}, r"metrics: .*at most 8 items"),
    ("13 rows", _rows(13), r"rows: .*at most 12 items"),
    ("a custom name without its unit", {"metrics": [{"name": "NPS", "value": "1", "prev": "1"}]}, "custom"),
    ("a key and a name", {"metrics": [_metric(name="NPS", unit="x")]}, "custom"),
    ("a metric twice", {"metrics": [_metric(), _metric()]}, "each metric at most once"),
    ("a custom name a built-in's", {"metrics": [{"name": "Revenue", "unit": "x", "value": "1", "prev": "1"}, _metric()]},
     "named twice"),
    ("a row twice", {"breakdown": {"kind": "region", "metric": "revenue", "rows": [["EMEA", "1", "2"], ["EMEA", "3", "4"]]}},
     "named twice"),
    ("a row twice but for NFC", {"breakdown": {"kind": "region", "metric": "revenue",
                                               "rows": [["Köln", "1", "2"], ["Ko\u0308ln", "3", "4"]]}}, "named twice"),
    ("a breakdown of no metric", {"breakdown": {"kind": "region", "metric": "orders", "rows": [["EMEA", "1", "2"]]}},
     "not among the metrics"),
]


@pytest.mark.parametrize("bad, why", [(b, w) for _, b, w in REFUSED], ids=[r[0] for r in REFUSED])
def test_the_api_refuses_what_is_outside_the_grammar(bad: dict[str, object], why: str) -> None:
    payload = {"tenant": "Acme", "period": "2026-Q3", "metrics": [_metric()], **bad}
    with pytest.raises(BadInput, match=why):
        check_spec("narrative", {"payload": payload}, "s1")


def test_the_api_takes_names_in_any_script_and_numbers_as_json_and_passes_them_on_as_given() -> None:
    """Every kind of name (scripts, signs, 80 characters), sent decomposed, comes back in NFC and
    otherwise as given; JSON numbers come back as the strings they write, negative ones too."""
    nfd = {"tenant": unicodedata.normalize("NFD", ANY_SCRIPT.tenant), "period": ANY_SCRIPT.period,
           "style": "formal",
           "metrics": [{"key": "revenue", "value": "-123456789.123456", "prev": 123456789012345, "target": "-0.000001"},
                       {"name": unicodedata.normalize("NFD", "Umsatz pro Kunde"), "unit": "€/Kunde",
                        "value": 980, "prev": 1020.5},
                       {"name": "売上高", "unit": "百万円", "value": -12.5, "prev": "-12.25", "target": "-12.5"},
                       {"name": "صافي الربح", "unit": "ر.س", "value": 0, "prev": -7},
                       {"key": "churn", "value": 2.4, "prev": "2.4"},
                       {"name": unicodedata.normalize("NFD", "Ø Bestellwert"), "unit": "EUR", "value": "41", "prev": 38,
                        "target": 40},
                       {"name": "n" * MAX_NAME, "unit": "u" * MAX_NAME, "value": 1, "prev": 2},
                       {"key": "orders", "value": "7", "prev": "6"}],
           "breakdown": {"kind": "segment", "metric": "Umsatz pro Kunde",
                         "rows": [[unicodedata.normalize("NFD", n), i * 10 - 50, str(i * 7)] for i, n in enumerate(SCRIPTS)]}}
    assert nfd["tenant"] != ANY_SCRIPT.tenant
    spec = check_spec("narrative", {"payload": nfd}, "s1")
    assert spec.payload.to_payload() == ANY_SCRIPT  # type: ignore[attr-defined]
    for x, want in ((980, "980"), (1020.5, "1020.5"), (-0.0, "0.0"), ("-0", "0"), (1e3, "1000.0"), ("2.50", "2.50"),
                    (123456789012345, "123456789012345"), ("0.000001", "0.000001"),
                    (0.1 + 0.2, "0.3"), (2.4000000000000004, "2.4")):  # JavaScript's sums: the binary noise dropped
        assert PayloadSpec.model_validate({**nfd, "metrics": [_metric(x)], "breakdown": None}).metrics[0].value == want
    with pytest.raises(ValueError, match="at most 15 significant digits"):  # 17 digits, the last ones data
        PayloadSpec.model_validate({**nfd, "metrics": [_metric(123456789012345.67)], "breakdown": None})


def test_section_and_report_titles_are_names() -> None:
    data = PayloadSpec.of(ANY_SCRIPT).model_dump()
    title = "Ü" * MAX_NAME
    spec = ReportSpec.model_validate({"title": "Rapport T3 | <Nord> (2026)", "data": data, "outline": [
        {"title": title, "metrics": [unicodedata.normalize("NFD", "Umsatz pro Kunde"), "revenue"]},
        {"title": "売上 & 利益", "metrics": ["売上高"]}]})
    assert spec.outline[0].title == title and spec.outline[0].metrics == ["Umsatz pro Kunde", "revenue"]
    for bad, why in (("x" * 81, "1-80 characters"), ("a\x85b", "U\\+0085"), ("<section>", "control token")):
        with pytest.raises(ValueError, match=why):
            SectionSpec(title=bad, metrics=["revenue"])
        with pytest.raises(ValueError, match=why):
            ReportSpec.model_validate({"title": bad, "data": data, "outline": [{"title": "T", "metrics": ["revenue"]}]})
    with pytest.raises(ValueError, match="not in data"):
        ReportSpec.model_validate({"title": "T", "data": data, "outline": [{"title": "T", "metrics": ["Umsatz"]}]})


def test_the_api_passes_names_on_canonical_and_refuses_two_that_are_then_one() -> None:
    """Spaces at a name's ends dropped, runs inside made one (grammar.canonical): what the model
    writes and the checker reads; the generator draws names so."""
    payload: dict[str, Any] = {
        "tenant": "Acme  Corp ", "period": "FY27",
        "metrics": [{"name": "Net  revenue ", "unit": "k  USD", "value": "1", "prev": "2"}],
        "breakdown": {"kind": "region", "metric": "Net revenue  ", "rows": [["North  America ", "1", "2"]]}}
    p = PayloadSpec.model_validate(payload).to_payload()
    assert (p.tenant, p.metrics[0].key, p.metrics[0].unit) == ("Acme Corp", "Net revenue", "k USD")
    assert p.breakdown is not None and (p.breakdown.metric, p.breakdown.rows[0][0]) == ("Net revenue", "North America")
    assert valid(p) is None
    assert SectionSpec(title="Revenue", metrics=["Net  revenue "]).metrics == ["Net revenue"]  # as the data names it
    twice = {**payload, "breakdown": {**payload["breakdown"], "rows": [["EMEA", "1", "2"], ["EMEA ", "3", "4"]]}}
    with pytest.raises(BadInput, match="named twice"):
        check_spec("narrative", {"payload": twice}, "s1")
    for seed in range(400):
        rng = random.Random(seed)
        assert all(canonical(n) == n for n in (wild_name(rng), wild_unit(rng)))


def test_an_agent_question_is_passed_on_canonical() -> None:
    assert AgentSpec(question="What was x  in uLX  in 2026? ").question == "What was x in uLX in 2026?"
    assert AgentSpec(question="S\u00e3o\u00a0Paulo\u2028 x").question == "S\u00e3o\u00a0Paulo\u2028 x"  # only U+0020
    with pytest.raises(ValueError, match="more than spaces"):
        AgentSpec(question="   ")


@pytest.mark.parametrize("question", ["2026年第3四半期の東京の売上はいくらでしたか？", "ما هي الإيرادات في الرياض في 2026؟",
                                      "Wie hoch war der Umsatz in Köln im 3. Quartal (Q3)?", "Сколько заказов в Москве?"])
def test_an_agent_question_is_taken_in_any_script_in_nfc(question: str) -> None:
    assert AgentSpec(question=unicodedata.normalize("NFD", question)).question == question


@pytest.mark.parametrize("question, why", [("What was [F1] in 2026?", "fact slot"), ("Was <call> x?", "String should match"),
                                           ("What\x85 was it?", "String should match"), ("Hi [BOS] x", "control token")])
def test_an_agent_question_smuggles_no_control_token(question: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        AgentSpec(question=question)


def test_every_wild_agent_question_is_one_the_api_accepts_and_its_tools_answer_as_a_tenants_dataset() -> None:
    from domain import agent, answers
    from workflows import tools

    for seed in range(300):
        task, store, pieces = agent.wild_example(random.Random(seed))
        AgentSpec(question=task.question, dataset="d")  # the API takes the question as it is
        table = tools.Table.of("d", [[*k, v] for k, v in store.values.items()])
        for call in task.calls:  # the runtime's tools read the store as a tenant's dataset: what training gave
            r = tools.run_call(call, table if call.startswith("metric") else store)
            assert r.ok and r.result == run_call(call, store), call
            args = re.findall(r'"([^"]*)"', call)
            assert call.startswith("calc") or all(a in task.question for a in args), "the call copies the question"
        text = "".join(t for t, _ in pieces)
        assert answers.check(task, text).answer_ok, text  # names with digits are not read as the answer


def _longest(tok: Any, form: corpus.Form) -> str:
    """The text of `form` whose every choice is the alternative of most tokens after what precedes it."""
    out = ""
    for alts in form:
        out += max(alts, key=lambda a: len(tok.encode(out + a)))
    return out


def _largest(style: str, n_metrics: int, metric_trend: str, row_trend: str) -> Payload:
    numbers = {"up": ("1240.5", "1105.25"), "down": ("1105", "1240"), "flat": ("7", "7")}
    keys = list(METRIC)[:n_metrics]
    return Payload("Acme", "2026-Q3", style, [Metric(k, *numbers[metric_trend], "1") for k in keys],
                   Breakdown("region", keys[0], [(f"R{i}", *numbers[row_trend]) for i in range(MAX_ROWS)]))


def test_the_default_max_new_tokens_hold_the_longest_text_of_the_largest_payload() -> None:
    """A narrative of MAX_METRICS metrics and MAX_ROWS rows, and a report section of 2 metrics and
    MAX_ROWS rows, in slot form as the shipped tokenizer with the slots reads them: the longest
    text the forms write (over every style and trend), and its EOS, fit the kind's default
    max_new_tokens, and a 6-section report of MAX_METRICS metrics, 2 a section, fits the context."""
    from domain.markup import SLOT_TOKENS
    from model.tokenizer import Tokenizer
    from workflows.narrative import narrative_input
    from workflows.report import report_parts, section_input, section_tokens

    tok = Tokenizer.from_file("model/shipped/tokenizer.json").with_tokens(SLOT_TOKENS)
    narrative = NarrativeSpec.model_fields["params"].get_default(call_default_factory=True).max_new_tokens
    section = ReportSpec.model_fields["params"].get_default(call_default_factory=True).max_new_tokens
    longest = {"narrative": 0, "section": 0}
    for style in STYLES:
        for m, r in [(m, r) for m in ("up", "down", "flat") for r in ("up", "down", "flat")]:
            p = _largest(style, MAX_METRICS, m, r)
            for drivers in (False, True):  # at detail full it says the breakdown's drivers too
                ids, _, rendered = narrative_input(tok, p, drivers=drivers)
                text = len(tok.encode(_longest(tok, corpus.narrative_form(rendered))))
                longest["narrative"] = max(longest["narrative"], text)
                assert len(ids) + narrative <= 2048
            p = _largest(style, 2, m, r)
            ids, _, rendered = section_input(tok, "Title", p)
            body = len(tok.encode(_longest(tok, corpus.narrative_form(rendered))))
            longest["section"] = max(longest["section"], body)
            assert body + 1 <= section_tokens(tok, rendered, 10**6)  # what a report plans a section for holds it
    # ... and the drivers' longest: one row up, the rest against the change, each named
    p = _largest("formal", MAX_METRICS, "up", "down")
    assert p.breakdown is not None
    p.breakdown.rows[0] = ("R0", "9999.5", "1")
    rendered = narrative_input(tok, p, drivers=True)[2]
    assert rendered.drivers is not None and len(rendered.drivers.against) == MAX_ROWS - 1
    longest["narrative"] = max(longest["narrative"], len(tok.encode(_longest(tok, corpus.narrative_form(rendered)))))
    assert longest["narrative"] + 1 <= narrative and longest["section"] + 1 <= section, longest  # + EOS
    keys = list(METRIC)[:MAX_METRICS]
    data = PayloadSpec.of(Payload("Acme", "2026-Q3", "formal", [Metric(k, "1240.5", "1105.25", "1") for k in keys]))
    report = ReportSpec.model_validate({"title": "Q3", "data": data.model_dump(), "outline": [
        {"title": f"Part {i}", "metrics": keys[2 * i % 8: 2 * i % 8 + 2]} for i in range(6)]})
    assert sum(report_parts(report, tok)) <= 2048
    # ... and with a breakdown of MAX_ROWS rows: each section is planned for its own longest body
    data = PayloadSpec.of(_largest("formal", MAX_METRICS, "up", "down"))
    report = ReportSpec.model_validate({"title": "Q3", "data": data.model_dump(), "outline": [
        {"title": f"Part {i}", "metrics": keys[2 * i % 8: 2 * i % 8 + 2]} for i in range(6)]})
    assert sum(report_parts(report, tok)) <= 2048
