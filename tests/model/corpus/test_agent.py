"""Agent transcripts: deterministic, consistent with the tools, and checked both ways."""

import random

import pytest

from model.corpus import agent as a


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
    for bad in ("__import__('os')", "2**10", "x+1", "1/0", "(1", "1" * 300):
        with pytest.raises(a.ToolError):
            a.calc(bad)


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
