"""Guided calls (domain/guide.py): the guide allows every call training writes and refuses a
miscopy."""

import random

from domain import agent as a
from domain.guide import CallNames, guided_call
from domain.tools import END_CALL, run_call


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
