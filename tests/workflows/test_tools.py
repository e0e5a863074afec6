"""workflows/tools.py: the runtime's one tool runner gives, for every call the model was trained
on, the result training gave (model/corpus/agent.py); whatever goes wrong is a result, never a
raise."""

from __future__ import annotations

import random

from model.corpus import agent as corpus
from runtime.jobs.specs import ToolOutput
from workflows import tools


def test_a_trained_call_gets_the_result_training_gave() -> None:
    for i in range(200):
        task, data, _ = corpus.example(random.Random(f"tools/{i}"))
        for call in task.calls:
            r = tools.run_call(call, data)
            assert r.ok and r.result == corpus.run_call(call, data), call
            assert r.tool == call.split("(", 1)[0] and r.call == call


def test_what_goes_wrong_comes_back_as_an_error_result() -> None:
    data = corpus.Dataset(7)
    for call, tool, reason in (('metric("revenue", "Mars", "2026-Q3")', "metric", "unknown region 'Mars'"),
                               ('metric("revenue")', None, "metric takes 3"),
                               ('calc("1/0")', "calc", "division by zero"),
                               ("rm -rf /", None, "not a tool call")):
        r = tools.run_call(call, data)
        assert not r.ok and r.tool == tool and r.result.startswith("error: ") and reason in r.result, r


def test_every_error_result_is_one_a_client_could_send() -> None:
    """Whatever the model writes, the result our tools give it is one the API takes from a client
    running the same tool (runtime/jobs/specs.py ToolOutput): the two paths read alike."""
    data = corpus.Dataset(7)
    for call in ('metric("' + "a" * 100 + '", "EMEA", "2026-Q3")', 'metric("' + "b" * 300 + '")',
                 'metric("revenue", "EMEA", "2026-Q3")<result>1', "[EOS]" * 50, 'calc("' + "9" * 300 + '")',
                 'metric("", "\x01", "2026-Q3")', 'calc("1/0")'):
        r = tools.run_call(call, data)
        assert not r.ok, r
        ToolOutput(call_id="call_0", output=r.result)  # raises if the API would refuse it


def test_a_tenant_table_says_what_a_slipped_training_transcript_says() -> None:
    """The mended call is learnt from the error text training gives (corpus.slipped): the
    runtime's table, read with the agent's question, gives that text for the same miscopy."""
    seen = 0
    for i in range(200):
        rng = random.Random(f"slip/{i}")
        task, store, pieces = corpus.wild_example(rng)
        slipped = corpus.slipped(task, store, rng)
        extra = [t for t, given in slipped if given and (t, given) not in pieces]
        if not extra:
            continue
        call, said = extra[0].removeprefix(corpus.CALL).removesuffix(corpus.END_CALL), extra[1]
        table = tools.Table.of("d", [[*k, v] for k, v in store.values.items()], task.question)
        assert f"{corpus.RESULT}{tools.run_call(call, table).result}{corpus.END_RESULT}\n" == said
        seen += "did you mean" in said
    assert seen > 50
