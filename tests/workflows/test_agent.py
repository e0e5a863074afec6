"""workflows/agent.py over a session in this process (the shipped model): tool calls run for real
and the answer uses their results; the call limit; a session that fills up ends the answer
early (a scripted Turns: the loop's own logic, no model)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from domain import agent as corpus
from model.config import ModelConfig
from model.params import DecodeError, DecodeParams
from model.profiles import Profile
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import NotFound, RequiresAction
from runtime.jobs.specs import AgentSpec, ParamsSpec
from runtime.sessions.local import LocalTurns
from runtime.sessions.turn import TurnResult
from workflows import agent

QUESTION = "By how much did revenue in EMEA change from 2026-Q2 to 2026-Q3, in percent?"
DATA = corpus.Dataset(2026)
V1, V2 = DATA.lookup("revenue", "EMEA", "2026-Q2"), DATA.lookup("revenue", "EMEA", "2026-Q3")
CALLS = [corpus.call_text("metric", "revenue", "EMEA", "2026-Q2"),
         corpus.call_text("metric", "revenue", "EMEA", "2026-Q3"), corpus.call_text("calc", f"({V2}-{V1})/{V1}*100")]
ANSWER = corpus.calc(f"({V2}-{V1})/{V1}*100")


@pytest.mark.parametrize("policy", ["ar", "set"])
def test_the_agent_calls_its_tools_and_answers_with_their_results(session: Callable[[], LocalTurns],
                                                                 policy: str) -> None:
    turns = session()
    params = ParamsSpec.model_validate({"policy": policy, "window": 4, "tau": 0.9, "max_new_tokens": 96})
    r = agent.run(turns, AgentSpec(question=QUESTION, dataset_seed=DATA.seed, params=params))
    assert r["finished"] and r["reason"] == "answer", r["text"]
    assert [c["call"] for c in r["calls"]] == CALLS and all(c["ok"] for c in r["calls"])
    assert [c["result"] for c in r["calls"]] == [V1, V2, ANSWER]  # run for real, by workflows/tools.py
    check = corpus.check(corpus.Task(QUESTION, CALLS, ANSWER, ""), r["text"])
    assert check.tool_call_ok and check.answer_ok and r["answer"] is not None and ANSWER in r["answer"]
    # a turn per segment: the first opens the session, each result resumes it
    assert [t["path"] for t in r["turns"]] == ["new"] + ["warm"] * len(CALLS)
    assert [t["turn"] for t in r["turns"]] == list(range(len(CALLS) + 1))
    assert turns.progress["calls"] == len(CALLS) and "worker" not in r
    assert r["verified"] and r["attempt"] == "first"  # the answer states the last call's number


def test_the_call_limit_ends_the_loop_before_the_next_call_runs(session: Callable[[], LocalTurns]) -> None:
    r = agent.run(session(), AgentSpec(question=QUESTION, dataset_seed=DATA.seed, max_calls=1))
    assert r["reason"] == "call_limit" and not r["finished"] and r["answer"] is None
    assert [c["call"] for c in r["calls"]] == CALLS[:1] and len(r["turns"]) == 2
    assert r["text"].endswith(corpus.END_CALL)  # the second call, written but not run


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


def test_the_metric_tool_reads_the_tenants_dataset_and_a_rerun_reads_what_it_read_then(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    table = [["revenue", "EMEA", "2026-Q2", "200"], ["revenue", "EMEA", "2026-Q3", "250"]]
    spec = AgentSpec(question=QUESTION, dataset="sales")
    turns = LocalTurns(*loaded, datasets={"sales": table})
    r = agent.run(turns, spec)
    assert [(c["result"], c["by"]) for c in r["calls"]] == [("200", "server"), ("250", "server"), ("25", "server")]
    assert r["verified"] and "25" in (r["answer"] or "")
    kept = dict(turns.tool_outputs)  # what each call answered, kept with the job
    assert set(kept) == {"server:call_1", "server:call_2", "server:call_3"}
    # a rerun (the job redelivered) after the dataset changed: the calls read what they read then
    again = agent.run(LocalTurns(*loaded, tool_outputs=kept, datasets={"sales": [["revenue", "EMEA", "2026-Q2", "1"]]}),
                      spec)
    assert (again["text"], again["calls"]) == (r["text"], r["calls"])
    # a row the dataset does not hold is an error result, as any tool's
    short = agent.run(LocalTurns(*loaded, datasets={"sales": table[:1]}), spec.model_copy(update={"max_calls": 2}))
    assert short["calls"][1]["result"] == "error: unknown period '2026-Q3'"  # no hint: copied right, not held
    with pytest.raises(NotFound):
        agent.run(LocalTurns(*loaded), spec)


SLIP = "How much higher was dc in dXqQjLuFRNQzcQq0umj than in Xfers 32 in 1993-H1?"  # agent_ood seed 1, #46
SLIP_TABLE = [["dc", "dXqQjLuFRNQzcQq0umj", "1993-H1", "577"], ["dc", "Xfers 32", "1993-H1", "6272"]]


@pytest.mark.parametrize("policy", ["ar", "prefix"])
def test_guided_calls_copy_the_questions_names_where_the_model_alone_miscopies_one(
        loaded: tuple[SetDLM, Tokenizer], policy: str) -> None:
    """Unguided, the shipped model writes "Xfgis 32" for the question's "Xfers 32" (one of the
    agent_ood failures); guided (the default), the refused "gis" gives way to the most probable
    token that keeps a name the question holds, and both calls read their rows."""
    params = ParamsSpec.model_validate({"policy": policy, "window": 8, "tau": 0.9, "max_new_tokens": 96})
    spec = AgentSpec(question=SLIP, dataset="t", params=params, allow_unverified=True, max_calls=3)
    alone = agent.run(LocalTurns(*loaded, datasets={"t": SLIP_TABLE}), spec.model_copy(update={"guided": False}))
    assert [c["ok"] for c in alone["calls"][:2]] == [True, False], alone["text"]
    assert "Xfgis 32" in alone["calls"][1]["call"]
    r = agent.run(LocalTurns(*loaded, datasets={"t": SLIP_TABLE}), spec)
    want = [corpus.call_text("metric", "dc", row, "1993-H1") for row in ("dXqQjLuFRNQzcQq0umj", "Xfers 32")]
    assert [c["call"] for c in r["calls"][:2]] == want and [c["result"] for c in r["calls"][:2]] == ["577", "6272"]
    assert r["calls"][2]["call"] == corpus.call_text("calc", "577-6272")  # its numbers copied from the results
    # its answer miscopies the name ("than in Xf down 3"): a 3 nothing said, so it is not verified
    assert r["verified"] is False and "the answer states ['3'] too" in r["problems"][0], r["answer"]


class Scripted:
    """Turns that answer each turn with the next scripted tokens, or raise the scripted error."""

    def __init__(self, tok: Tokenizer, cfg: ModelConfig, script: list[list[int] | Exception]) -> None:
        self.tokenizer, self.cfg, self.script = tok, cfg, script
        self.profile = Profile.for_model(cfg, tok)
        self.inputs: list[list[int]] = []

    def turn(self, ids: list[int], params: DecodeParams, *, text: str = "", infill: bool = False) -> TurnResult:
        self.inputs.append(ids)
        step = self.script[len(self.inputs) - 1]
        if isinstance(step, Exception):
            raise step
        return TurnResult("scripted", step, "new" if len(self.inputs) == 1 else "warm", turn=len(self.inputs) - 1)

    def used(self) -> int:
        return 0

    def report(self, **progress: Any) -> None:
        pass

    def checked(self, part: str, outcome: str) -> None:
        pass


def test_a_full_session_ends_the_answer_early_and_a_first_turn_error_fails_it(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    model, tok = loaded
    full = DecodeError("context_overflow", "the session is full")
    call = tok.encode(f'{corpus.CALL}calc("1+1"){corpus.END_CALL}')
    turns = Scripted(tok, model.cfg, [call, full])
    r = agent.run(turns, AgentSpec(question="What is 1 + 1?"))
    assert r["reason"] == "context" and not r["finished"] and r["answer"] is None
    assert r["calls"] == [{"id": "call_1", "call": 'calc("1+1")', "tool": "calc", "result": "2", "ok": True, "by": "server"}]
    assert turns.inputs[1] == tok.encode(f"{corpus.RESULT}2{corpus.END_RESULT}\n")  # the result, appended
    assert turns.inputs[0][0] == model.cfg.bos_id
    with pytest.raises(DecodeError):  # nothing written yet: the job fails
        agent.run(Scripted(tok, model.cfg, [full]), AgentSpec(question="What is 1 + 1?"))
