"""Agent transcripts: deterministic, consistent with the tools (the tools themselves:
tests/domain/test_tools.py; how transcripts are read back and verified: tests/domain/test_answers.py)."""

import random
import re

from domain import agent as a
from domain import answers
from domain.tools import CALL, END_RESULT, RESULT, RESULT_RE, run_call


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
