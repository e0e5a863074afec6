"""An agent's facts as slots: the question's names its source holds and each result are slots,
the model's calls and answer point at them, and the runtime writes them back exactly; the guide
and the verifier read slot-form transcripts as training writes them."""

import random

from domain import agent as a
from domain import answers
from domain.agent_facts import AgentFacts, in_slots, source_names
from domain.facts import SLOT, slots_in
from domain.guide import CallNames, guided_call
from domain.tools import CALL, END_RESULT, RESULT, SAMPLE_NAMES, Dataset, Store, held_names, run_call

SAMPLE = [n for names in SAMPLE_NAMES for n in names]


def test_source_names_are_whole_longest_first_in_the_questions_order() -> None:
    q = "What was the total Umsatz across EMEA North, EMEA and 東京 in Q1 2026 (not EMEA2)?"
    held = ["EMEA", "EMEA North", "Umsatz", "東京", "Q1 2026", "Q1", "MEA", "2026", "Nordics"]
    assert source_names(q, held) == ["Umsatz", "EMEA North", "EMEA", "東京", "Q1 2026"]
    f = AgentFacts.of(q, source_names(q, held))
    assert f.question == "What was the total [F1] across [F2], [F3] and [F4] in [F5] (not EMEA2)?"
    assert f.written(f.question) == q


def _examples(n: int) -> list[tuple[a.Task, Dataset | Store, list[tuple[str, bool]], list[str]]]:
    rng, out = random.Random(11), []
    for i in range(n):
        if i % 2:
            task, data, pieces = a.example(rng)
            out.append((task, data, pieces, SAMPLE))
        else:
            task, store, pieces = a.wild_example(rng)
            out.append((task, store, pieces, [n for names in held_names(store.values) for n in names]))
    return out


_EX = _examples(600)


def test_a_transcript_in_slots_writes_back_to_the_text_and_verifies() -> None:
    for task, data, pieces, held in _EX:
        facts, slotted = in_slots(task, pieces, held, first=random.Random(task.question).randint(0, 60))
        text = "".join(t for t, _ in pieces)
        assert facts.written("".join(t for t, _ in slotted)) == text
        for (t, given), (s, _) in zip(pieces, slotted):
            if given and not t.startswith(RESULT + "error"):
                assert SLOT.fullmatch(s[len(RESULT):-len(END_RESULT) - 1]), s  # a result: one slot
        # every name the source holds is a slot: none of them is written as text by the model
        targets = "".join(s for s, given in slotted if not given)
        assert not [n for n in source_names(task.question, held) if n in SLOT.sub("", targets) and len(n) > 3
                    and n in SLOT.sub("", facts.question)]
        made = [(c, run_call(c, data)) for c in task.calls]
        answer = answers.answer_of(facts.written(slotted[-1][0]))
        assert answer is not None and answers.verify(task.question, made, answer, sample=held is SAMPLE,
                                                     names=source_names(task.question, held)) == [], task.question




def test_the_guide_allows_every_call_training_writes_in_slots_and_no_slot_of_its_own() -> None:
    for task, _, pieces, held in _EX[:300]:
        facts, slotted = in_slots(task, pieces, held)
        names = CallNames.sample(facts.question) if held is SAMPLE else CallNames(facts.question)
        read: list[str] = []
        for s, given in slotted:
            if given:
                read.append(s[len(RESULT):-len(END_RESULT) - 1])
            elif s.startswith(CALL):
                call = s[len(CALL):]
                guide = names.after(read)
                opened = len('metric("' if call.startswith("metric(") else 'calc("')
                assert all(guided_call(call[:j], guide) for j in range(opened, len(call) + 1)), call
    n = CallNames("By how much did [F1] in [F2] change from [F3] to [F4], in percent?").after(["[F5]", "[F6]"])
    assert guided_call('calc("([F6]-[F5])/[F5]*100")</call>', n)
    assert guided_call('calc("([F6]-[F', n) and guided_call('calc("[F5]*[F6', n)
    for bad in ('calc("[F1]+[F5]', 'calc("[F5]+5', 'calc("[F7', 'calc("[F6]-2026', 'metric("[F5]'):
        assert not guided_call(bad, n), bad  # a name's slot, a digit of a slot, a slot no result holds
    assert guided_call('metric("[F1]", "[F2]", "[F3]")</call>', n)


def test_a_result_is_a_slot_and_an_error_quotes_names_as_slots() -> None:
    f = AgentFacts.of("What was churn in EMEA in 2026-Q3?", ["churn", "EMEA", "2026-Q3"])
    assert f.result("2.4") == "[F4]" and f.result("2.4") == "[F4]" and f.result("-3") == "[F5]"
    assert f.result("error: unknown region 'EMEA'") == "error: unknown region '[F2]'"
    assert slots_in(f.question) == ["[F1]", "[F2]", "[F3]"]


def test_an_answer_that_points_at_a_fact_twice_is_a_problem() -> None:
    """Set decoding at a low threshold wrote "... to [F4][F4].[F4]." ("to Oct. 2026Oct. 2026.Oct.
    2026."): every number right, the answer garbled; 11 of 60 such answers passed verify() before."""
    assert answers.slot_problems("[F1] in [F2] changed by [F7]% from [F3] to [F4].") == []
    assert answers.slot_problems("[F1] in [F2] changed by [F7]% from [F3] to [F4][F4].[F4].") == [
        "the answer says [F4] more than once"]
    for task, _, pieces, held in _EX[:200]:  # no answer training writes says a fact twice
        _, slotted = in_slots(task, pieces, held)
        assert answers.slot_problems(answers.answer_of(slotted[-1][0]) or "") == []


def test_a_question_of_more_names_than_slots_keeps_the_rest_as_text() -> None:
    names = [f"n{i}" for i in range(150)]
    q = "What was the total " + ", ".join(names) + "?"
    f = AgentFacts.of(q, source_names(q, names))
    assert len(f.slots.texts) == 88 and "n149" in f.question and f.written(f.question) == q
    for _ in range(8):  # and every call's result still gets its slot
        f.result(str(len(f.slots.texts)))
