"""workflows/agent.py over a session in this process (the shipped model): tool calls run for real
and the answer uses their results; the call limit and a session that fills up end the job with
no answer; the answer verified (a scripted Turns: the loop's own logic, no model): the last
segment's only, its calls fitting the question."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from domain import agent as corpus
from domain import answers
from domain.facts import Slots
from domain.tools import CALL, END_CALL, END_RESULT, RESULT, Dataset, calc, call_text
from model.config import ModelConfig
from model.params import DecodeError, DecodeParams
from model.profiles import Profile
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import NoAnswer, NotFound, RequiresAction, Unverified
from runtime.jobs.params import ParamsSpec
from runtime.jobs.specs import AgentSpec
from runtime.sessions.local import LocalTurns
from runtime.sessions.turn import TurnResult
from workflows import agent

QUESTION = "By how much did revenue in EMEA change from 2026-Q2 to 2026-Q3, in percent?"
DATA = Dataset(2026)
V1, V2 = DATA.lookup("revenue", "EMEA", "2026-Q2"), DATA.lookup("revenue", "EMEA", "2026-Q3")
CALLS = [call_text("metric", "revenue", "EMEA", "2026-Q2"),
         call_text("metric", "revenue", "EMEA", "2026-Q3"), call_text("calc", f"({V2}-{V1})/{V1}*100")]
ANSWER = calc(f"({V2}-{V1})/{V1}*100")
NAMES = ["revenue", "EMEA", "2026-Q2", "2026-Q3"]  # the question's names a table of these rows holds


@pytest.mark.parametrize("policy", ["ar", "set"])
def test_the_agent_calls_its_tools_and_answers_with_their_results(session: Callable[[], LocalTurns],
                                                                 policy: str) -> None:
    turns = session()
    params = ParamsSpec.model_validate({"policy": policy, "window": 4, "tau": 0.9, "max_new_tokens": 96})
    r = agent.run(turns, AgentSpec(question=QUESTION, dataset_seed=DATA.seed, params=params))
    assert r["finished"] and r["reason"] == "answer", r["text"]
    assert [c["call"] for c in r["calls"]] == CALLS and all(c["ok"] for c in r["calls"])
    assert [c["result"] for c in r["calls"]] == [V1, V2, ANSWER]  # run for real, by workflows/tools.py
    check = answers.check(corpus.Task(QUESTION, CALLS, ANSWER, ""), r["text"])
    assert check.tool_call_ok and check.answer_ok and r["answer"] is not None and ANSWER in r["answer"]
    # a turn per segment: the first opens the session, each result resumes it
    assert [t["path"] for t in r["turns"]] == ["new"] + ["warm"] * len(CALLS)
    assert [t["turn"] for t in r["turns"]] == list(range(len(CALLS) + 1))
    assert turns.progress["calls"] == len(CALLS) and "worker" not in r
    assert r["verified"] and r["attempt"] == "first"  # the answer states the last call's number


def test_the_call_limit_ends_the_job_without_an_answer_before_the_next_call_runs(
        session: Callable[[], LocalTurns]) -> None:
    turns = session()
    with pytest.raises(NoAnswer) as e:  # nothing to flag: not even allow_unverified takes it back
        agent.run(turns, AgentSpec(question=QUESTION, dataset_seed=DATA.seed, max_calls=1, allow_unverified=True))
    assert e.value.code == "no_answer" and e.value.problems == ["no answer: the call limit was reached"]
    assert turns.progress["calls"] == 1 and turns.turns == 2  # the second call, written but not run


def test_a_client_tool_stops_the_agent_at_its_call_and_its_output_reads_as_the_servers(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    spec = AgentSpec(question=QUESTION, dataset_seed=DATA.seed, client_tools=["metric"])
    with pytest.raises(RequiresAction) as e:
        agent.run(LocalTurns(*loaded), spec)
    assert e.value.calls == [{"id": "call_1", "tool": "metric", "call": CALLS[0],
                              "arguments": {"metric": "revenue", "region": "EMEA", "period": "2026-Q2"}}]
    with pytest.raises(RequiresAction) as e:  # the first answered: it stops at the next metric call
        agent.run(LocalTurns(*loaded, tool_outputs={"call_1": V1}), spec)
    assert [c["id"] for c in e.value.calls] == ["call_2"] and e.value.calls[0]["call"] == CALLS[1]
    # the client's outputs are the dataset's values: the run the server's own tools make
    client = agent.run(LocalTurns(*loaded, tool_outputs={"call_1": V1, "call_2": V2}), spec)
    server = agent.run(LocalTurns(*loaded), AgentSpec(question=QUESTION, dataset_seed=DATA.seed))
    assert client["text"] == server["text"] and client["answer"] == server["answer"] and client["verified"]
    assert [(c["id"], c["by"]) for c in client["calls"]] == [("call_1", "client"), ("call_2", "client"),
                                                              ("call_3", "server")]  # calc stays here
    # the client's own data: another value, another answer, computed from it
    mine = agent.run(LocalTurns(*loaded, tool_outputs={"call_1": "200", "call_2": "250"}), spec)
    assert [c["result"] for c in mine["calls"]] == ["200", "250", "25"] and "25" in (mine["answer"] or "")


def test_a_client_call_holding_a_slot_that_names_no_fact_is_answered_here(loaded: tuple[SetDLM, Tokenizer]) -> None:
    """A model may write a slot token where a client's name goes ("[F17]026-Q2": none such in
    the table, so it stays once the facts are written out): the call never reaches the client,
    its error is the result the model reads (a question never holds a slot's text: refused)."""
    spec = AgentSpec(question=QUESTION, client_tools=["metric"])
    turns = LocalTurns(*loaded)
    call = agent._run_call(turns, spec, 'metric("revenue", "EMEA", "[F17]026-Q2")', "call_1", DATA)
    assert (call["by"], call["ok"]) == ("server", False) and "names no fact" in call["result"], call
    with pytest.raises(RequiresAction) as e:  # the same call, right: it goes to the client
        agent._run_call(turns, spec, 'metric("revenue", "EMEA", "2026-Q3")', "call_1", DATA)
    assert e.value.calls[0]["arguments"]["period"] == "2026-Q3"


def test_the_metric_tool_reads_the_tenants_dataset_and_a_rerun_reads_what_it_read_then(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    table = [["revenue", "EMEA", "2026-Q2", "200"], ["revenue", "EMEA", "2026-Q3", "250"]]
    spec = AgentSpec(question=QUESTION, dataset="sales")
    turns = LocalTurns(*loaded, datasets={"sales": table})
    r = agent.run(turns, spec)
    assert [(c["result"], c["by"]) for c in r["calls"]] == [("200", "server"), ("250", "server"), ("25", "server")]
    assert r["verified"] and "25" in (r["answer"] or "")
    kept = dict(turns.tool_outputs)  # what each call answered, kept with the job
    assert set(kept) == {"server:call_1", "server:call_2", "server:call_3", "server:names"}
    # the question's names the table held when the job first read it: its slots, on a rerun too
    assert json.loads(kept["server:names"]) == NAMES
    # a rerun (the job redelivered) after the dataset changed: the calls read what they read then
    again = agent.run(LocalTurns(*loaded, tool_outputs=kept, datasets={"sales": [["revenue", "EMEA", "2026-Q2", "1"]]}),
                      spec)
    assert (again["text"], again["calls"]) == (r["text"], r["calls"])
    # a row the dataset does not hold is an error result, as any tool's (no answer rests on it: the
    # segment after it opens with "A: ", as the guide holds it, and that answer is refused)
    short = LocalTurns(*loaded, datasets={"sales": table[:1]})
    with pytest.raises(Unverified) as e:
        agent.run(short, spec.model_copy(update={"max_calls": 2}))
    assert "the answer rests on no result: the last call failed" in e.value.problems
    said = json.loads(short.tool_outputs["server:call_2"])
    assert said["result"] == "error: unknown period '2026-Q3'"  # no hint: copied right, not held
    with pytest.raises(NotFound):
        agent.run(LocalTurns(*loaded), spec)


SLIP = "How much higher was dc in dXqQjLuFRNQzcQq0umj than in Xfers 32 in 1993-H1?"  # agent_ood seed 1, #46
SLIP_TABLE = [["dc", "dXqQjLuFRNQzcQq0umj", "1993-H1", "577"], ["dc", "Xfers 32", "1993-H1", "6272"]]


@pytest.mark.parametrize("policy", ["ar", "prefix"])
def test_the_questions_names_enter_as_slots_so_guided_or_not_the_calls_copy_them(
        loaded: tuple[SetDLM, Tokenizer], policy: str) -> None:
    """Before slots, the shipped model wrote "Xfgis 32" for the question's "Xfers 32" unguided (one
    of the agent_ood failures) and only the guide kept it right.  Now each name the table holds is
    a slot of the question: the model points at it and the runtime writes it, so the unguided run
    copies both names and writes what the guided run writes, and both answers are verified."""
    params = ParamsSpec.model_validate({"policy": policy, "window": 8, "tau": 0.9, "max_new_tokens": 96})
    spec = AgentSpec(question=SLIP, dataset="t", params=params, allow_unverified=True, max_calls=3)
    alone_turns = LocalTurns(*loaded, datasets={"t": SLIP_TABLE})
    alone = agent.run(alone_turns, spec.model_copy(update={"guided": False}))
    assert json.loads(alone_turns.tool_outputs["server:names"]) == ["dc", "dXqQjLuFRNQzcQq0umj", "Xfers 32", "1993-H1"]
    r = agent.run(LocalTurns(*loaded, datasets={"t": SLIP_TABLE}), spec)
    want = [call_text("metric", "dc", row, "1993-H1") for row in ("dXqQjLuFRNQzcQq0umj", "Xfers 32")]
    for x in (alone, r):
        assert [c["call"] for c in x["calls"][:2]] == want and [c["result"] for c in x["calls"][:2]] == ["577", "6272"]
        assert x["calls"][2]["call"] == call_text("calc", "577-6272")  # its numbers: the results' slots
        assert x["verified"] is True and x["problems"] == [] and "-5695" in (x["answer"] or ""), x["answer"]
        assert "Xfers 32" in (x["answer"] or "")  # the name written out by the runtime, not miscopied
    assert (alone["text"], alone["calls"], alone["answer"]) == (r["text"], r["calls"], r["answer"])


class Scripted:
    """Turns that answer each turn with the next scripted tokens (a text: its tokens, then EOS
    unless it ends at a call), or raise the scripted error; a client's outputs given up front."""

    def __init__(self, tok: Tokenizer, cfg: ModelConfig, script: list[list[int] | str | Exception],
                 outputs: dict[str, str] | None = None) -> None:
        self.tokenizer, self.cfg, self.script, self.outputs = tok, cfg, script, outputs or {}
        self.profile = Profile.for_model(cfg, tok)
        self.inputs: list[list[int]] = []

    def turn(self, ids: list[int], params: DecodeParams, *, text: str = "", infill: bool = False,
             facts: Slots | None = None) -> TurnResult:
        self.inputs.append(ids)
        step = self.script[len(self.inputs) - 1]
        if isinstance(step, Exception):
            raise step
        if isinstance(step, str):
            step = self.tokenizer.encode(step) + ([] if step.endswith(END_CALL) else [self.cfg.eos_id])
        return TurnResult("scripted", step, "new" if len(self.inputs) == 1 else "warm", turn=len(self.inputs) - 1)

    def used(self) -> int:
        return 0

    def report(self, **progress: Any) -> None:
        pass

    def checked(self, part: str, outcome: str) -> None:
        pass

    def tool_output(self, call_id: str) -> str | None:
        return self.outputs.get(call_id)


def test_a_full_session_ends_the_job_without_an_answer_and_a_first_turn_error_fails_it(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    model, tok = loaded
    full = DecodeError("context_overflow", "the session is full")
    turns = Scripted(tok, model.cfg, [f'{CALL}calc("1+1"){END_CALL}', full])
    with pytest.raises(NoAnswer) as e:
        agent.run(turns, AgentSpec(question="What is 1 + 1?", allow_unverified=True))
    assert e.value.code == "no_answer" and e.value.problems == ["no answer: the session is full"]
    # the result, appended as a slot (the question holds no name of the sample dataset: the
    # result's is the table's first), the runtime writes its "2"
    assert turns.inputs[1] == tok.encode(f"{RESULT}[F1]{END_RESULT}\n")
    assert turns.inputs[0][0] == model.cfg.bos_id
    with pytest.raises(DecodeError):  # nothing written yet: the job fails
        agent.run(Scripted(tok, model.cfg, [full]), AgentSpec(question="What is 1 + 1?"))


# ---- verified: the last segment's answer, its calls fitting the question ----------------------

def call(tool: str, *args: str) -> str:
    return f"{CALL}{call_text(tool, *args)}{END_CALL}"


@pytest.mark.parametrize("allow", [False, True])
def test_an_answer_a_tool_result_holds_is_no_answer(loaded: tuple[SetDLM, Tokenizer], allow: bool) -> None:
    """A result may quote anything (a call's text in its error, a client's output): its "A: ..."
    is not the answer.  The last segment holds none, nor does its retry: no_answer, also where
    allow_unverified would take back a wrong answer."""
    model, tok = loaded
    quoted = Scripted(tok, model.cfg, [call("calc", "A: The result is 5"), "Done.", "Done."])
    with pytest.raises(NoAnswer) as e:
        agent.run(quoted, AgentSpec(question="What is 2 + 3?", allow_unverified=allow))
    assert e.value.code == "no_answer" and e.value.problems == ["no answer: the last segment holds no A:"]
    assert tok.decode(quoted.inputs[1]).startswith(f"{RESULT}error: unsupported expression in 'A: The result is 5'")
    q = "What was churn in EMEA in 2026-Q1?"
    client = Scripted(tok, model.cfg, [call("metric", "churn", "EMEA", "2026-Q1"), "Done.", "Done."],
                      {"call_1": "error: A: Churn in EMEA in 2026-Q1 was 3.1%"})
    with pytest.raises(NoAnswer):
        agent.run(client, AgentSpec(question=q, client_tools=["metric"], allow_unverified=allow))


def test_an_answer_is_the_last_segments_and_needs_a_calls_result(loaded: tuple[SetDLM, Tokenizer]) -> None:
    """An answer with no call's result to state is decoded again, then flagged (or unverified),
    never a success that says nothing of it (verified None)."""
    model, tok = loaded
    turns = Scripted(tok, model.cfg, ["A: 7.", "A: 7."])
    r = agent.run(turns, AgentSpec(question="What is 3 + 4?", allow_unverified=True))
    assert r["verified"] is False and r["attempt"] == "ar_retry" and r["answer"] == "7." and len(turns.inputs) == 2
    assert r["problems"] == r["retried"]["problems"] == ["the answer rests on no result: no call was made", unformed("7.")]
    # no answer first, one on its retry: verified
    late = Scripted(tok, model.cfg, [call("calc", "3+4"), "Done.", "A: The result is 7."])
    r = agent.run(late, AgentSpec(question="What is 3 + 4?"))
    assert r["verified"] is True and r["attempt"] == "ar_retry" and r["answer"] == "The result is 7."
    assert r["retried"]["problems"] == ["no answer: the last segment holds no A:"] and r["text"].endswith("A: The result is 7.")


def unformed(answer: str) -> str:
    """The problem of an answer whose words are none of the answer forms' (answers.form_problems)."""
    return f"the answer's words are not those of any answer form training writes: {answer!r}"


V = DATA.lookup("churn", "EMEA", "2026-Q1")
R1, R2 = DATA.lookup("revenue", "EMEA", "2026-Q1"), DATA.lookup("revenue", "APAC", "2026-Q1")
Q1 = "What was churn in EMEA in 2026-Q1?"
WRONG = {  # the question, the calls the model wrote, its answer (twice: the retry's too), the problems
    "doubled": (Q1, [call("metric", "churn", "EMEA", "2026-Q1")] * 2 + [call("calc", f"{V}+{V}")],
                f"A: Churn in EMEA in 2026-Q1 was {calc(f'{V}+{V}')}%.",
                ['metric("churn", "EMEA", "2026-Q1") repeats an earlier call',
                 "the question asks for one row (it names no operation), and the answer rests on 2 rows read and 1 calc(s)",
                 unformed(f"Churn in EMEA in 2026-Q1 was {calc(f'{V}+{V}')}%.")]),  # no form glues a % to a row's number
    "a period's digits": (Q1, [call("calc", "2026+100")], "A: Churn in EMEA in 2026-Q1 was 2126%.",
                          [*(f'calc("2026+100") uses {n}, which no earlier result holds and the question does not '
                             "write as a number" for n in ("2026", "100")),
                           *(f"the question names {n!r}, which no call reads" for n in ("churn", "EMEA", "2026-Q1")),
                           "calc('2026+100') is no expression the question writes",
                           "the question writes 2 expressions or numbers apart ('2026-', '1'): what it asks of them "
                           "cannot be told",
                           "the answer writes 2126 %, and nothing it read gives a unit",
                           unformed("Churn in EMEA in 2026-Q1 was 2126%.")]),
    "a unit it made up": ("What was the total revenue across EMEA and APAC in 2026-Q1?",
                          [call("metric", "revenue", r, "2026-Q1") for r in ("EMEA", "APAC")] + [call("calc", f"{R1}+{R2}")],
                          f"A: Total revenue across EMEA and APAC in 2026-Q1 was {calc(f'{R1}+{R2}')} %.",
                          [f"the answer writes {calc(f'{R1}+{R2}')} %, and the metric's unit is k USD"]),
    "nobody's number": ("What is 40 + 2?", [call("calc", "40+3")], "A: The result is 43.",
                        ['calc("40+3") uses 3, which no earlier result holds and the question does not write as a number',
                         "calc('40+3') is no expression the question writes",
                         "calc('40+3') is not the whole expression the question writes, '40+2'"]),
    "another region": (Q1, [call("metric", "churn", "APAC", "2026-Q1")],
                       f"A: Churn in EMEA in 2026-Q1 was {DATA.lookup('churn', 'APAC', '2026-Q1')}%.",
                       ['metric("churn", "APAC", "2026-Q1") reads region \'APAC\', which the question does not name',
                        "the question names 'EMEA', which no call reads",
                        unformed(f"Churn in EMEA in 2026-Q1 was {DATA.lookup('churn', 'APAC', '2026-Q1')}%.")]),
}


def _total_revenue() -> tuple[list[str], AgentSpec]:
    """The calls that answer "the total revenue across EMEA and APAC in 2026-Q1", and its spec."""
    calls = [call("metric", "revenue", r, "2026-Q1") for r in ("EMEA", "APAC")] + [call("calc", f"{R1}+{R2}")]
    return calls, AgentSpec(question="What was the total revenue across EMEA and APAC in 2026-Q1?",
                            dataset_seed=DATA.seed)


def test_an_answer_with_a_word_no_answer_form_writes_is_never_verified(loaded: tuple[SetDLM, Tokenizer]) -> None:
    """Every number right, one word garbled: refused (unverified), however it was decoded."""
    model, tok = loaded
    calls, spec = _total_revenue()
    garbled = f"A: Total smmmm revenue in EMEA and APAC in 2026-Q1 was {calc(f'{R1}+{R2}')}."
    with pytest.raises(Unverified) as e:
        agent.run(Scripted(tok, model.cfg, [*calls, garbled, garbled]), spec)
    assert e.value.code == "unverified" and e.value.problems == [unformed(garbled.removeprefix("A: "))]
    right = f"A: Total revenue across EMEA and APAC in 2026-Q1 was {calc(f'{R1}+{R2}')} k USD."
    assert agent.run(Scripted(tok, model.cfg, [*calls, right]), spec)["verified"] is True


def test_a_word_before_the_answers_a_is_never_verified(loaded: tuple[SetDLM, Tokenizer]) -> None:
    """The answer whole and right, a word before its "A:": refused (unverified), as a garbled
    answer is; the transcript the job returns would hold it."""
    model, tok = loaded
    calls, spec = _total_revenue()
    said = f"smmmm A: Total revenue across EMEA and APAC in 2026-Q1 was {calc(f'{R1}+{R2}')} k USD."
    with pytest.raises(Unverified) as e:
        agent.run(Scripted(tok, model.cfg, [*calls, said, said]), spec)
    assert e.value.code == "unverified" and e.value.problems == ["the last segment writes 'smmmm' before its answer"]
    assert agent.run(Scripted(tok, model.cfg, [*calls, said.removeprefix("smmmm ")]), spec)["verified"] is True


@pytest.mark.parametrize("case", list(WRONG))
def test_calls_that_do_not_fit_the_question_fail_verification(loaded: tuple[SetDLM, Tokenizer], case: str) -> None:
    model, tok = loaded
    question, calls, answer, problems = WRONG[case]
    spec = AgentSpec(question=question, dataset_seed=DATA.seed)
    with pytest.raises(Unverified) as e:  # decoded again: the same calls, the same problems
        agent.run(Scripted(tok, model.cfg, [*calls, answer, answer]), spec)
    assert e.value.code == "unverified" and e.value.problems == problems
    r = agent.run(Scripted(tok, model.cfg, [*calls, answer, answer]), spec.model_copy(update={"allow_unverified": True}))
    assert r["verified"] is False and r["problems"] == problems and r["answer"] == answer.removeprefix("A: ")


def test_the_forms_training_writes_are_verified_first(loaded: tuple[SetDLM, Tokenizer]) -> None:
    """Arithmetic over the question's numbers; a total, a difference and a percent change (its
    100) over results: the calls run for real (the sample dataset)."""
    model, tok = loaded
    v1, v2 = (DATA.lookup("churn", r, "2026-Q1") for r in ("EMEA", "APAC"))
    cases = [("What is (4821 + 37) - 5?", [call("calc", "(4821+37)-5")], "A: The result is 4853."),
             (QUESTION, [f"{CALL}{c}{END_CALL}" for c in CALLS],
              f"A: Revenue in EMEA changed by {ANSWER}% from 2026-Q2 to 2026-Q3."),
             ("What was the total churn across EMEA and APAC in 2026-Q1?",
              [call("metric", "churn", r, "2026-Q1") for r in ("EMEA", "APAC")] + [call("calc", f"{v1}+{v2}")],
              f"A: Total churn across EMEA and APAC in 2026-Q1 was {calc(f'{v1}+{v2}')} %."),
             ("How much higher was churn in EMEA than in APAC in 2026-Q1?",
              [call("metric", "churn", r, "2026-Q1") for r in ("EMEA", "APAC")] + [call("calc", f"{v1}-{v2}")],
              f"A: Churn in EMEA was {calc(f'{v1}-{v2}')} % higher than in APAC.")]
    for question, calls, answer in cases:
        r = agent.run(Scripted(tok, model.cfg, [*calls, answer]), AgentSpec(question=question, dataset_seed=DATA.seed))
        assert r["verified"] is True and r["attempt"] == "first" and r["problems"] == [], (question, r["text"])
        assert all(c["ok"] for c in r["calls"]) and r["answer"] == answer.removeprefix("A: ")


@pytest.mark.parametrize("question, total", [
    ("What was the total revenue across EMEA and APAC in 2026-Q3?", "812.25"),
    ("What was the total Umsatz across Berlin and München in 2026-Q3?", "200.5")])
def test_a_total_of_a_tenants_table_is_stated_with_no_unit_its_rows_do_not_give(
        loaded: tuple[SetDLM, Tokenizer], question: str, total: str) -> None:
    """The model wrote "... was 812.25 %." after a tenant's total (its training's totals carry
    units) and the job failed `unverified`, the retry too: the answer's guide (tools.UnitGuide)
    refuses a unit the checker would refuse after a result, so the first decode states the total
    as the rows give it, verified."""
    table = {"world": [["revenue", "EMEA", "2026-Q3", "512.25"], ["revenue", "APAC", "2026-Q3", "300"],
                       ["Umsatz", "Berlin", "2026-Q3", "123.5"], ["Umsatz", "München", "2026-Q3", "77"]]}
    r = agent.run(LocalTurns(*loaded, datasets=table), AgentSpec(question=question, dataset="world"))
    assert r["verified"] and r["attempt"] == "first", r
    assert r["answer"].endswith(f" {total}."), r["answer"]
