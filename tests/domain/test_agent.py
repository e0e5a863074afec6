"""Agent transcripts: deterministic, consistent with the tools, and checked both ways."""

import random
import re
import warnings

import pytest

from domain import agent as a
from domain.markup import SPECIAL_TOKENS


def test_generation_is_deterministic_and_self_consistent() -> None:
    one = [a.example(random.Random(f"t/{i}")) for i in range(500)]
    two = [a.example(random.Random(f"t/{i}")) for i in range(500)]
    assert [t for _, _, t in one] == [t for _, _, t in two]
    kinds = set()
    for task, data, pieces in one:
        text = "".join(t for t, _ in pieces)
        c = a.check(task, text)
        assert c.tool_call_ok and c.answer_ok, (task, text)
        # every result in the transcript is what the tool returns for that call
        for call, res in zip(c.calls, [t for t, given in pieces if given]):
            assert res == f"{a.RESULT}{a.run_call(call, data)}{a.END_RESULT}\n"
        assert not any("error" in t for t, given in pieces if given)
        kinds.add(task.calls[-1].split("(")[0] + str(len(task.calls)))
    assert {"metric1", "calc1", "calc3"} <= kinds


def test_calc_evaluates_arithmetic_and_refuses_anything_else() -> None:
    assert a.calc("(1200-950)/950*100") == "26.32"
    assert a.calc("2+3*4") == "14" and a.calc("-7/2") == "-3.5" and a.calc("0.1+0.2") == "0.3"
    for bad in ("__import__('os')", "2**10", "x+1", "1/0", "(1", "1" * 300, "0x10", "1_0", "1e5", "45orp"):
        with pytest.raises(a.ToolError), warnings.catch_warnings():
            warnings.simplefilter("error")  # "45orp" once printed Python's SyntaxWarning on the worker's stderr
            a.calc(bad)
    assert a.calc(" 2 + 3 ") == "5"


def test_metric_lookup_is_deterministic_and_validates_its_arguments() -> None:
    d = a.Dataset(7)
    assert d.lookup("revenue", "EMEA", "2026-Q3") == a.Dataset(7).lookup("revenue", "EMEA", "2026-Q3")
    assert d.lookup("revenue", "EMEA", "2026-Q3") != a.Dataset(8).lookup("revenue", "EMEA", "2026-Q3")
    assert a.run_call('metric("revenue", "Mars", "2026-Q3")', d).startswith("error: unknown region")
    assert a.run_call('metric("revenue")', d).startswith("error: metric takes 3")
    assert a.run_call("rm -rf /", d).startswith("error: not a tool call")


def test_the_checker_catches_a_wrong_call_and_a_wrong_answer() -> None:
    task, data, pieces = a.example(random.Random(3))
    text = "".join(t for t, _ in pieces)
    assert a.check(task, text).answer_ok
    wrong_answer = text.rsplit("A:", 1)[0] + "A: The result is 12345678."
    assert not a.check(task, wrong_answer).answer_ok
    no_calls = "A: " + task.final
    c = a.check(task, no_calls)
    assert c.answer_ok and not c.tool_call_ok
    assert not a.check(task, text.replace("A:", "")).answer_ok


def test_an_error_result_is_held_to_the_rule_every_result_is() -> None:
    """A reason quoting what the model wrote (a marker, a control token's text, control
    characters, any length) still gives a result RESULT_RE takes, with nothing that would read
    as a marker or encode to a control token."""
    for reason in ("", "   ", "not a tool call: '<result>9</result>'", "x" * 500, "[EOS] and [MASK]\n\x00",
                   "a\tb", "<" * 300, "é" * 199 + "<"):
        r = a.error_result(reason)
        assert re.fullmatch(a.RESULT_RE, r), (reason, r)
        assert not any(s in r for s in SPECIAL_TOKENS) and "<" not in r and ">" not in r, r
    assert a.error_result("division by zero") == "error: division by zero"  # a plain reason is kept
    assert a.error_result("[EOS]") == "error: (EOS)"
    assert a.error_result("y" * 300) == "error: " + "y" * 197 + "..."
    long_call = 'metric("' + "<result>" * 40 + '")'
    assert re.fullmatch(a.RESULT_RE, a.run_call(long_call, a.Dataset(7)))


def test_a_missing_row_names_what_is_not_held_and_hints_only_at_a_miscopy_of_the_question() -> None:
    q = "How much higher was dc in Xfers 32 than in dXqQj in 1993-H1?"
    held = a.held_names([("dc", "Xfers 32", "1993-H1"), ("dc", "dXqQj", "1993-H1"), ("dc", "Xfers 33", "1993-H2")])
    def said(*call: str, question: str = q) -> str:
        return str(a.no_row(call, held, question))  # type: ignore[arg-type]
    assert said("dc", "Xfgis 32", "1993-H1") == "unknown region 'Xfgis 32': did you mean 'Xfers 32'?"
    assert said("d", "Xfers 32", "zz") == "unknown metric 'd': did you mean 'dc'?; unknown period 'zz'"
    assert said("dc", "Xfgis 32", "1993-H1", question="") == "unknown region 'Xfgis 32'"  # no question: no hint
    # copied right from the question but not held: no hint (a held neighbour would be a wrong row)
    held_q3 = a.held_names([("revenue", "EMEA", "2026-Q2")])
    assert str(a.no_row(("revenue", "EMEA", "2026-Q3"), held_q3, "revenue in EMEA in 2026-Q3?")) == \
        "unknown period '2026-Q3'"
    # the closest held name the question does not hold is no hint either ("Xfers 33")
    assert said("dc", "Xfers 34", "1993-H1") == "unknown region 'Xfers 34': did you mean 'Xfers 32'?"
    assert said("dc", "Xfers 32", "1993-H2") == "no row for metric 'dc', region 'Xfers 32', period '1993-H2'"
    store = a.Store({("dc", "Xfers 32", "1993-H1"): "577"})
    assert store.lookup("dc", "Xfers 32", "1993-H1") == "577"
    with pytest.raises(a.ToolError, match=r"^unknown region 'Xfgis 32'$"):
        store.lookup("dc", "Xfgis 32", "1993-H1")


def test_a_slipped_transcript_mends_one_call_after_its_error() -> None:
    for i in range(300):
        rng = random.Random(f"slip/{i}")
        task, store, pieces = a.wild_example(rng)
        slipped = a.slipped(task, store, rng)
        if len(slipped) == len(pieces):
            continue  # no slip that is not a held name (one-character names): the plain transcript
        assert len(slipped) == len(pieces) + 2
        wrong = [t for t, given in slipped if given and t.startswith(a.CALL)]
        assert len(wrong) == 1 and a.check(task, "".join(t for t, _ in slipped)).answer_ok
        errors = [t for t, given in slipped if given and "error:" in t]
        assert len(errors) == 1 and re.fullmatch(a.RESULT_RE, errors[0][len(a.RESULT):-len(a.END_RESULT) - 1])
        # the slip's pieces removed, the rest is the plain transcript
        assert [p for p in slipped if p[0] not in (*wrong, *errors)] == pieces


def test_a_guided_call_allows_every_call_training_writes_and_refuses_a_miscopy() -> None:
    """The guide's grammar and the corpus agree: every prefix of every call a transcript holds
    (sample dataset or any names; calc after the results before it), then `</call>`, is allowed;
    a character off is not."""
    rng = random.Random(5)
    for i in range(300):
        task, data, pieces = a.example(rng) if i % 2 else a.wild_example(rng)
        names = a.CallNames.sample(task.question) if i % 2 else a.CallNames(task.question)
        results = [a.run_call(c, data) for c in task.calls]
        for k, call in enumerate(task.calls):
            whole, guide = call + a.END_CALL, names.after(results[:k])
            verdicts = [a.guided_call(whole[:j], guide) for j in range(len(whole) + 1)]
            opened = len('metric("' if call.startswith("metric(") else 'calc("')
            assert all(v is None for v in verdicts[:opened]), call  # the tool's name: not guided
            assert all(verdicts[opened:]), (call, verdicts.index(False))
    n = a.CallNames("What was the total st1m7 across Xfers 32 and b in 2073-Q1?").after(["939823.2", "6323.7"])
    refused = ['metric("s1', 'metric("st1m7", "Xfg', 'metric("st1m7","', 'metric("st1m"', 'metric("st1m7", "b", "2073-Q1"))',
               'metric("st1m7", "b", "2073-Q1", "', 'metric("b", "b", "2073-Q1")x', 'metric("across Xfers 32 and b in 2"',
               'calc("(6323.7-99', 'calc("6323.7-.', 'calc("6323.7-939823.2")")', 'calc("6323.7 x', 'calc("632-']
    assert [a.guided_call(c, n) for c in refused] == [False] * len(refused)
    # a name the question holds whole anywhere (a word's start to a word's end) is allowed: guiding
    # refuses what no name is, never a name the question asks about that a dataset may not hold
    allowed = ['metric("Xfers', 'metric("Xfers 32", "across Xfers 32 and b in 2073', 'metric("b", "b", "b")</call>',
               'calc("(6323.7-939823.2)/939823.2*100")</call>', 'calc("32+2073', 'calc("(2073 - 32) * 100")']
    assert all(a.guided_call(c, n) for c in allowed)
    assert a.guided_call('calc("7', a.CallNames("q")) is None  # no numbers known: calc not guided
    s = a.CallNames.sample("What was churn in EMEA in 2026-Q3?")  # the sample dataset's names too
    assert a.guided_call('metric("revenue", "APAC", "2025-Q1")', s) and not a.guided_call('metric("revenu"', s)


def test_a_stray_number_is_one_no_result_and_no_name_of_the_question_holds() -> None:
    q = "How much higher was dc in dXqQjLuFRNQzcQq0umj than in Xfers 32 in W41-2090?"
    said = a.answer_numbers(" dc in dXqQjLuFRNQzcQq0umj was -5695 higher than in Xf down 3 in W41-2090 (577, 32).")
    assert said == ["-5695", "3", "2090", "577", "32"]
    assert a.stray_numbers(said, q, ["577", "6272", "-5695"]) == ["3"]


# ---- verifying an answer without its task ----------------------------------------------------

def made_of(text: str) -> list[tuple[str, str]]:
    """A flat transcript's calls with their results, in order."""
    calls = re.findall(re.escape(a.CALL) + r"(.*?)" + re.escape(a.END_CALL), text)
    results = re.findall(re.escape(a.RESULT) + r"(.*?)" + re.escape(a.END_RESULT), text)
    return list(zip(calls, results, strict=True))


def test_every_transcript_the_corpus_writes_verifies() -> None:
    """The rules fit what training writes: every kind, the sample dataset and any names, a slip
    mended after its error (its failed call rests nothing)."""
    kinds = set()
    for i in range(500):
        rng = random.Random(f"verify/{i}")
        for task, data, pieces in (a.example(rng), a.wild_example(rng)):
            text = "".join(t for t, _ in pieces)
            answer = a.answer_of(a.last_segment(text))
            assert answer is not None and answer == pieces[-1][0].removeprefix("A:"), text
            assert a.verify(task.question, made_of(text), answer, sample=isinstance(data, a.Dataset)) == [], text
            kinds.add(task.calls[-1].split("(")[0] + str(len(task.calls)))
        task, store, _ = a.wild_example(rng)
        text = "".join(t for t, _ in a.slipped(task, store, rng))
        assert a.verify(task.question, made_of(text), a.answer_of(a.last_segment(text)) or "") == [], text
    assert {"metric1", "calc1", "calc3", "calc4"} <= kinds  # lookup, arithmetic, change or diff, total


Q1 = "What was the churn in Western Europe in 2026-Q1?"
M1 = a.call_text("metric", "churn", "Western Europe", "2026-Q1")


def test_a_doubled_call_fails_verification() -> None:
    """The issue's job: one row read twice and added is no answer to a question about one row."""
    made = [(M1, "6114"), (M1, "6114"), ('calc("6114+6114")', "12228")]
    assert a.call_problems(Q1, made) == [f"{M1} repeats an earlier call"]
    assert a.verify(Q1, made, " Churn in Western Europe in 2026-Q1 was 12228.") == [f"{M1} repeats an earlier call"]
    twice = [(M1, "6114"), ('calc("6114+6114")', "12228"), ('calc("6114 + 6114")', "12228")]  # spaces aside, the same
    assert a.call_problems(Q1, twice) == ['calc("6114 + 6114") repeats an earlier call']
    # a call repeated after it failed (a client's outage) rests on one result: no problem
    assert a.call_problems(Q1, [(M1, "error: the warehouse is offline"), (M1, "6114")]) == []


def test_a_calc_over_a_periods_digits_or_a_number_nobody_wrote_fails_verification() -> None:
    """The question's numbers are its words that are numbers: not a period's digits, and not 100
    by default."""
    assert a.question_numbers("What is (4821 + 37) - 5.5? in 2026-Q1, W41-2090, Xfers 32") == {"4821", "37", "5.5", "32"}
    assert a.question_numbers("Compute (40+2)*3 - -1 in 2026-03, Ab/12, 40-2.") == {"40", "2", "3", "1"}
    made = [('calc("2026+100")', "2126")]
    assert a.verify(Q1, made, " Churn in Western Europe in 2026-Q1 was 2126.") == [
        f'calc("2026+100") uses {n}, which no earlier result holds and the question does not write as a number'
        for n in ("2026", "100")]
    q = "What is 40 + 2?"
    assert a.call_problems(q, [('calc("40+2")', "42")]) == []
    assert a.call_problems(q, [('calc("40+3")', "43")]) == [
        'calc("40+3") uses 3, which no earlier result holds and the question does not write as a number']
    # a question about metrics computes from its results: its own numbers are no operand
    q2 = "What was the total churn across EMEA and APAC in 2026-Q1, plus 5?"
    metrics = [(a.call_text("metric", "churn", r, "2026-Q1"), v) for r, v in (("EMEA", "2.5"), ("APAC", "3.1"))]
    assert a.call_problems(q2, [*metrics, ('calc("2.5+3.1+5")', "10.6")]) == [
        'calc("2.5+3.1+5") uses 5, which no earlier result holds']
    # nor a name's digits ("Xfers 32"), nor a failed call's words
    q3 = "How much higher was dc in Ab than in Xfers 32 in 1993-H1?"
    m3 = [(a.call_text("metric", "dc", "Ab", "1993-H1"), "577"), (a.call_text("metric", "dc", "Xfers 32", "1993-H1"),
                                                                     "error: unknown region 'Xfers 32'")]
    assert a.call_problems(q3, [*m3, ('calc("577-32")', "545")]) == ['calc("577-32") uses 32, which no earlier result holds']


def test_the_100_of_a_percent_change_of_two_results_only_where_the_question_asks_in_percent() -> None:
    q = "By how much did churn in EMEA change from 2026-Q2 to 2026-Q3, in percent?"
    metrics = [(a.call_text("metric", "churn", "EMEA", p), v) for p, v in (("2026-Q2", "2.50"), ("2026-Q3", "3.1"))]
    assert a.verify(q, [*metrics, ('calc("(3.1-2.50)/2.50*100")', "24")],
                    " Churn in EMEA changed by 24% from 2026-Q2 to 2026-Q3.") == []
    assert a.call_problems(q, [*metrics, ('calc("(3.1 - 2.50) / 2.50 * 100")', "24")]) == []  # spaces aside
    not_a_change = ['calc("(3.1-2.50)/3.1*100")', 'calc("(3.1+2.50)/2.50*100")', 'calc("3.1*100")',
                    'calc("(3.1-2.50)/2.50*1000")']
    for c in not_a_change:
        assert a.call_problems(q, [*metrics, (c, "1")]) != [], c
    diff = "How much higher was churn in EMEA in 2026-Q3 than in 2026-Q2?"  # no percent asked
    assert a.call_problems(diff, [*metrics, ('calc("(3.1-2.50)/2.50*100")', "24")]) == [
        'calc("(3.1-2.50)/2.50*100") uses 100, which no earlier result holds']


def test_a_metric_call_names_only_what_the_question_names() -> None:
    wrong = a.call_text("metric", "churn", "EMEA", "2026-Q1")
    assert a.call_problems(Q1, [(wrong, "2.5")], sample=True) == [
        f"{wrong} reads region 'EMEA', which the question does not name"]
    # a sample metric's key where the question says its name, in any case
    q = "What was Average Order Value in APAC in 2026-Q1?"
    assert a.call_problems(q, [(a.call_text("metric", "aov", "APAC", "2026-Q1"), "42.10")], sample=True) == []
    assert a.call_problems(q, [(a.call_text("metric", "aov", "APAC", "2026-Q1"), "42.10")]) == [
        "metric(\"aov\", \"APAC\", \"2026-Q1\") reads metric 'aov', which the question does not name"]  # a tenant's


def test_an_answer_states_the_last_result_of_a_call_that_gave_one() -> None:
    q = "What is 40 + 2?"
    assert a.answer_problems(q, [], " 42.") == ["the answer rests on no result: no call was made"]
    assert a.answer_problems(q, [('calc("40+2")', "error: x")], " 42.") == [
        "the answer rests on no result: the last call failed"]
    assert a.answer_problems(q, [('calc("40+2")', "42")], " The result is 41.") == [
        "the answer states ['41'], not 42, the number the last call returned"]
    assert a.answer_problems(q, [('calc("40+2")', "42")], " The result is 42, not 7.") == [
        "the answer states ['7'] too, which no result and no name in the question holds"]


def test_the_answer_is_the_last_segments_never_a_results() -> None:
    """A result may say anything an error says (a client's, or a call quoted back): an "A:" in
    it is no answer, nor is an earlier segment's."""
    call = 'calc("A: 5")'
    quoted = a.run_call(call, a.Dataset(1))  # its error quotes the call
    said = f"{a.CALL}{call}{a.END_CALL}{a.RESULT}{quoted}{a.END_RESULT}\n"
    assert "A: 5" in quoted
    task = a.Task("What is 2 + 3?", ['calc("2+3")'], "5", "The result is 5.")
    assert a.check(task, said + "The end.").answer is None and not a.check(task, said + "The end.").answer_ok
    earlier = f"A: The result is 5.{a.CALL}calc(\"2+3\"){a.END_CALL}{a.RESULT}5{a.END_RESULT}\nDone."
    assert a.check(task, earlier).answer is None
    assert a.answer_of(f'A: 5 {a.CALL}calc("2+3")') is None  # a segment that calls does not answer
    assert a.answer_of("The sum: A: The result is 5. A: 6") == " The result is 5. A: 6"  # all of it is checked
