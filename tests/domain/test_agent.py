"""Agent transcripts: deterministic, consistent with the tools (how they are read back and
verified: tests/domain/test_answers.py)."""

import random
import re
import warnings

import pytest

from domain import agent as a
from domain import answers
from domain.guide import CallNames, guided_call
from domain.markup import SPECIAL_TOKENS
from domain.tools import (
    CALL,
    END_CALL,
    END_RESULT,
    RESULT,
    RESULT_RE,
    Dataset,
    Store,
    ToolError,
    calc,
    error_result,
    held_names,
    no_row,
    run_call,
)


def test_generation_is_deterministic_and_self_consistent() -> None:
    one = [a.example(random.Random(f"t/{i}")) for i in range(500)]
    two = [a.example(random.Random(f"t/{i}")) for i in range(500)]
    assert [t for _, _, t in one] == [t for _, _, t in two]
    kinds = set()
    for task, data, pieces in one:
        text = "".join(t for t, _ in pieces)
        c = answers.check(task, text)
        assert c.tool_call_ok and c.answer_ok, (task, text)
        # every result in the transcript is what the tool returns for that call
        for call, res in zip(c.calls, [t for t, given in pieces if given]):
            assert res == f"{RESULT}{run_call(call, data)}{END_RESULT}\n"
        assert not any("error" in t for t, given in pieces if given)
        kinds.add(task.calls[-1].split("(")[0] + str(len(task.calls)))
    assert {"metric1", "calc1", "calc3"} <= kinds


def test_calc_evaluates_arithmetic_and_refuses_anything_else() -> None:
    assert calc("(1200-950)/950*100") == "26.32"
    assert calc("2+3*4") == "14" and calc("-7/2") == "-3.5" and calc("0.1+0.2") == "0.3"
    for bad in ("__import__('os')", "2**10", "x+1", "1/0", "(1", "1" * 300, "0x10", "1_0", "1e5", "45orp"):
        with pytest.raises(ToolError), warnings.catch_warnings():
            warnings.simplefilter("error")  # "45orp" once printed Python's SyntaxWarning on the worker's stderr
            calc(bad)
    assert calc(" 2 + 3 ") == "5"


def test_metric_lookup_is_deterministic_and_validates_its_arguments() -> None:
    d = Dataset(7)
    assert d.lookup("revenue", "EMEA", "2026-Q3") == Dataset(7).lookup("revenue", "EMEA", "2026-Q3")
    assert d.lookup("revenue", "EMEA", "2026-Q3") != Dataset(8).lookup("revenue", "EMEA", "2026-Q3")
    assert run_call('metric("revenue", "Mars", "2026-Q3")', d).startswith("error: unknown region")
    assert run_call('metric("revenue")', d).startswith("error: metric takes 3")
    assert run_call("rm -rf /", d).startswith("error: not a tool call")


def test_an_error_result_is_held_to_the_rule_every_result_is() -> None:
    """A reason quoting what the model wrote (a marker, a control token's text, control
    characters, any length) still gives a result RESULT_RE takes, with nothing that would read
    as a marker or encode to a control token."""
    for reason in ("", "   ", "not a tool call: '<result>9</result>'", "x" * 500, "[EOS] and [MASK]\n\x00",
                   "a\tb", "<" * 300, "é" * 199 + "<"):
        r = error_result(reason)
        assert re.fullmatch(RESULT_RE, r), (reason, r)
        assert not any(s in r for s in SPECIAL_TOKENS) and "<" not in r and ">" not in r, r
    assert error_result("division by zero") == "error: division by zero"  # a plain reason is kept
    assert error_result("[EOS]") == "error: (EOS)"
    assert error_result("y" * 300) == "error: " + "y" * 197 + "..."
    long_call = 'metric("' + "<result>" * 40 + '")'
    assert re.fullmatch(RESULT_RE, run_call(long_call, Dataset(7)))


def test_a_missing_row_names_what_is_not_held_and_hints_only_at_a_miscopy_of_the_question() -> None:
    q = "How much higher was dc in Xfers 32 than in dXqQj in 1993-H1?"
    held = held_names([("dc", "Xfers 32", "1993-H1"), ("dc", "dXqQj", "1993-H1"), ("dc", "Xfers 33", "1993-H2")])
    def said(*call: str, question: str = q) -> str:
        return str(no_row(call, held, question))  # type: ignore[arg-type]
    assert said("dc", "Xfgis 32", "1993-H1") == "unknown region 'Xfgis 32': did you mean 'Xfers 32'?"
    assert said("d", "Xfers 32", "zz") == "unknown metric 'd': did you mean 'dc'?; unknown period 'zz'"
    assert said("dc", "Xfgis 32", "1993-H1", question="") == "unknown region 'Xfgis 32'"  # no question: no hint
    # copied right from the question but not held: no hint (a held neighbour would be a wrong row)
    held_q3 = held_names([("revenue", "EMEA", "2026-Q2")])
    assert str(no_row(("revenue", "EMEA", "2026-Q3"), held_q3, "revenue in EMEA in 2026-Q3?")) == \
        "unknown period '2026-Q3'"
    # the closest held name the question does not hold is no hint either ("Xfers 33")
    assert said("dc", "Xfers 34", "1993-H1") == "unknown region 'Xfers 34': did you mean 'Xfers 32'?"
    assert said("dc", "Xfers 32", "1993-H2") == "no row for metric 'dc', region 'Xfers 32', period '1993-H2'"
    store = Store({("dc", "Xfers 32", "1993-H1"): "577"})
    assert store.lookup("dc", "Xfers 32", "1993-H1") == "577"
    with pytest.raises(ToolError, match=r"^unknown region 'Xfgis 32'$"):
        store.lookup("dc", "Xfgis 32", "1993-H1")


def test_a_slipped_transcript_mends_one_call_after_its_error() -> None:
    for i in range(300):
        rng = random.Random(f"slip/{i}")
        task, store, pieces = a.wild_example(rng)
        slipped = a.slipped(task, store, rng)
        if len(slipped) == len(pieces):
            continue  # no slip that is not a held name (one-character names): the plain transcript
        assert len(slipped) == len(pieces) + 2
        wrong = [t for t, given in slipped if given and t.startswith(CALL)]
        assert len(wrong) == 1 and answers.check(task, "".join(t for t, _ in slipped)).answer_ok
        errors = [t for t, given in slipped if given and "error:" in t]
        assert len(errors) == 1 and re.fullmatch(RESULT_RE, errors[0][len(RESULT):-len(END_RESULT) - 1])
        # the slip's pieces removed, the rest is the plain transcript
        assert [p for p in slipped if p[0] not in (*wrong, *errors)] == pieces


def test_a_guided_call_allows_every_call_training_writes_and_refuses_a_miscopy() -> None:
    """The guide's grammar and the corpus agree: every prefix of every call a transcript holds
    (sample dataset or any names; calc after the results before it), then `</call>`, is allowed;
    a character off is not."""
    rng = random.Random(5)
    for i in range(300):
        task, data, pieces = a.example(rng) if i % 2 else a.wild_example(rng)
        names = CallNames.sample(task.question) if i % 2 else CallNames(task.question)
        results = [run_call(c, data) for c in task.calls]
        for k, call in enumerate(task.calls):
            whole, guide = call + END_CALL, names.after(results[:k])
            verdicts = [guided_call(whole[:j], guide) for j in range(len(whole) + 1)]
            opened = len('metric("' if call.startswith("metric(") else 'calc("')
            assert all(v is None for v in verdicts[:opened]), call  # the tool's name: not guided
            assert all(verdicts[opened:]), (call, verdicts.index(False))
    n = CallNames("What was the total st1m7 across Xfers 32 and b in 2073-Q1?").after(["939823.2", "6323.7"])
    refused = ['metric("s1', 'metric("st1m7", "Xfg', 'metric("st1m7","', 'metric("st1m"', 'metric("st1m7", "b", "2073-Q1"))',
               'metric("st1m7", "b", "2073-Q1", "', 'metric("b", "b", "2073-Q1")x', 'metric("across Xfers 32 and b in 2"',
               'calc("(6323.7-99', 'calc("6323.7-.', 'calc("6323.7-939823.2")")', 'calc("6323.7 x', 'calc("632-']
    assert [guided_call(c, n) for c in refused] == [False] * len(refused)
    # a name the question holds whole anywhere (a word's start to a word's end) is allowed: guiding
    # refuses what no name is, never a name the question asks about that a dataset may not hold
    allowed = ['metric("Xfers', 'metric("Xfers 32", "across Xfers 32 and b in 2073', 'metric("b", "b", "b")</call>',
               'calc("(6323.7-939823.2)/939823.2*100")</call>', 'calc("32+2073', 'calc("(2073 - 32) * 100")']
    assert all(guided_call(c, n) for c in allowed)
    assert guided_call('calc("7', CallNames("q")) is None  # no numbers known: calc not guided
    s = CallNames.sample("What was churn in EMEA in 2026-Q3?")  # the sample dataset's names too
    assert guided_call('metric("revenue", "APAC", "2025-Q1")', s) and not guided_call('metric("revenu"', s)
