"""workflows/checked.py through the workflows, over a session in this process (the shipped model):
a narrative, a report section and the key figures whose first decode is made wrong (a Turns
double that swaps two facts' slots in what a turn wrote) are decoded again with greedy AR in the same session, as
a document of their own, and come back right (`attempt: ar_retry`); wrong twice, the job fails
with "unverified" and the problems, or comes back flagged when its spec allows it; a retry that
does not fit the plan's room is not decoded.  The agent's answer (a scripted Turns): its retry
is the whole document again as one input, never a turn after the failed answer.  As a job (a
real Redis, a SQLite file): rerun after its retry was written, it replays both turns, returns
what an uninterrupted run returns, and its outcome is counted once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from domain import narrative as corpus
from domain.facts import Slots
from domain.payload import Breakdown, Metric, Payload
from domain.tools import CALL, END_CALL
from model.config import ModelConfig
from model.params import DecodeParams
from model.profiles import Profile
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.db import make_engine
from runtime.errors import Unverified
from runtime.jobs.context import JobContext, JobServices
from runtime.jobs.events import JobEvents
from runtime.jobs.params import ParamsSpec
from runtime.jobs.payload import PayloadSpec
from runtime.jobs.routing import Routing
from runtime.jobs.rows import Jobs
from runtime.jobs.specs import AgentSpec, NarrativeSpec
from runtime.sessions.engine import Engine
from runtime.sessions.local import LocalTurns
from runtime.sessions.metrics import TurnMetrics
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.sessions.turn import TurnResult
from runtime.settings import Settings
from tests.workflows.conftest import long_report_spec, report_spec
from tests.workflows.test_agent import DATA, QUESTION
from tests.workflows.test_narrative import PAYLOAD
from workflows import agent, narrative, report

SPEC = NarrativeSpec(payload=PayloadSpec.of(PAYLOAD))  # the kind's default: prefix, W 8
#: what the checker says of SPEC's narrative with the slots of revenue's value and prev swapped
SWAPPED = ("Revenue: slots [[F4]='12.2%', [F7]='1105', [F6]='k USD', [F5]='1240', [F8]='1300'] "
           "where [[F4]='12.2%', [F5]='1240', [F6]='k USD', [F7]='1105', [F8]='1300'] go")


def swapped(tok: Tokenizer, tokens: list[int], facts: Slots | None, old: str, new: str) -> list[int]:
    """`tokens` (what the model wrote, in slot form) with the slots of the facts `old` and `new`
    swapped: the text the runtime writes out then says `new` where `old` goes and the other way
    round (the checker reads the slots: a swapped pair is a wrong narrative)."""
    assert facts is not None and old in facts.texts and new in facts.texts, facts
    a, b = (facts.tokens()[facts.texts.index(x)] for x in (old, new))
    text = tok.decode(tokens)
    assert a in text and b in text, text
    return tok.encode(text.replace(a, "\0").replace(b, a).replace("\0", b))


class Wrong(LocalTurns):
    """LocalTurns whose turns number `wrong` (0-based) come back with the slots of the facts `old`
    and `new` swapped (the session's own tokens are the model's: only what the workflow reads is
    wrong); each turn's input and params are kept."""

    def __init__(self, model: SetDLM, tok: Tokenizer, wrong: set[int], old: str = "1240", new: str = "1105") -> None:
        super().__init__(model, tok)
        self.wrong, self.old, self.new = wrong, old, new
        self.calls: list[tuple[list[int], DecodeParams, bool]] = []

    def turn(self, ids: list[int], params: DecodeParams, *, text: str = "", infill: bool = False,
             facts: Slots | None = None) -> TurnResult:
        self.calls.append((ids, params, infill))
        r = super().turn(ids, params, text=text, infill=infill, facts=facts)
        if r.turn in self.wrong:
            if infill:  # the holes' tokens, one for one: the first hole's token replaced by another digit
                seven, eight = self.tokenizer.encode("7")[0], self.tokenizer.encode("8")[0]
                r.tokens = [eight if r.tokens[0] == seven else seven, *r.tokens[1:]]
            else:
                r.tokens = swapped(self.tokenizer, r.tokens, facts, self.old, self.new)
        return r


def test_a_right_narrative_is_verified_on_its_first_decode(session: Callable[[], LocalTurns]) -> None:
    turns = session()
    r = narrative.run(turns, SPEC)
    assert r["verified"] is True and r["attempt"] == "first" and r["problems"] == [] and "retried" not in r
    assert r["facts_ok"] == r["facts_total"] > 0 and turns.turns == 1
    assert turns.checks == {("narrative", "first"): 1}


def test_a_wrong_narrative_is_decoded_again_with_greedy_ar_as_a_document_of_its_own(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    turns = Wrong(*loaded, wrong={0})
    r = narrative.run(turns, SPEC)
    assert r["verified"] is True and r["attempt"] == "ar_retry" and r["problems"] == []
    assert r["text"].index("1240") < r["text"].index("1105") and r["facts_ok"] == r["facts_total"]
    assert r["retried"]["problems"] == [SWAPPED] and r["retried"]["turn"] == 0
    assert r["turn"] == 1 and turns.turns == 2  # the retry: one more turn of the same session
    (ids0, p0, _), (ids1, p1, _) = turns.calls
    assert ids1 == ids0 and ids1[0] == loaded[0].cfg.doc_start_id  # the same input: a new document
    assert (p0.policy, p1.policy, p1.window, p1.tau, p1.temperature) == ("prefix", "ar", 1, None, 0.0)
    assert p1.max_new_tokens == p0.max_new_tokens and p1.stop == p0.stop
    # it cannot see the failed attempt in its cache: it writes what greedy AR writes on a new session
    fresh = narrative.run(LocalTurns(*loaded), SPEC.model_copy(update={"params": ParamsSpec(
        policy="ar", window=1, tau=None, max_new_tokens=SPEC.params.max_new_tokens)}))
    assert r["text"] == fresh["text"]
    assert turns.checks == {("narrative", "ar_retry"): 1}


def test_a_narrative_wrong_twice_fails_unverified_with_its_problems(loaded: tuple[SetDLM, Tokenizer]) -> None:
    turns = Wrong(*loaded, wrong={0, 1})
    with pytest.raises(Unverified) as e:
        narrative.run(turns, SPEC)
    assert e.value.code == "unverified" and "after the greedy AR retry" in e.value.message
    assert e.value.problems == [SWAPPED], e.value.problems
    assert turns.turns == 2 and turns.checks == {("narrative", "unverified"): 1}


def test_a_narrative_wrong_twice_comes_back_flagged_when_its_spec_allows_it(loaded: tuple[SetDLM, Tokenizer]) -> None:
    turns = Wrong(*loaded, wrong={0, 1})
    r = narrative.run(turns, SPEC.model_copy(update={"allow_unverified": True}))
    assert r["verified"] is False and r["attempt"] == "ar_retry" and r["problems"] == [SWAPPED]
    assert r["text"].index("1105") < r["text"].index("1240")  # the swapped slots, written out
    assert r["facts_ok"] < r["facts_total"] and turns.checks == {("narrative", "flagged"): 1}


def test_a_narrative_decoded_with_greedy_ar_is_not_decoded_again(loaded: tuple[SetDLM, Tokenizer]) -> None:
    turns = Wrong(*loaded, wrong={0})
    spec = SPEC.model_copy(update={"params": ParamsSpec(policy="ar", window=1, tau=None, max_new_tokens=200)})
    with pytest.raises(Unverified) as e:
        narrative.run(turns, spec)
    assert turns.turns == 1 and "greedy AR already" in e.value.problems[-1]
    assert "after the greedy AR retry" not in e.value.message


#: Asia's population 1957 -> 1962 by 5 countries whose deltas add up to 2.4% of the change: a
#: partial breakdown (drivers.BreakdownDriver.covers false); with the rest of Asia, a whole one
ASIA_ROWS = [("Korea, Dem. Rep.", "10917494", "9411381"), ("Mongolia", "1010280", "882134"),
             ("Cambodia", "6083619", "5322536"), ("Jordan", "933559", "746559"), ("Nepal", "10332057", "9682338")]
ASIA = Payload("Gapminder", "1962", "formal", [Metric("pop", "1529384151", "1395357351", custom_unit="people")],
               Breakdown("region", "pop", ASIA_ROWS))
WHOLE_ASIA = Payload(ASIA.tenant, ASIA.period, ASIA.style, ASIA.metrics,
                     Breakdown("region", "pop", [*ASIA_ROWS, ("Rest of Asia", "1500107142", "1369312403")]))


class ClaimsTheWhole(LocalTurns):
    """LocalTurns whose narratives come back with their drivers' sentence of the rows shown
    replaced by one claiming the whole change ("The largest part of the change came from ...")."""

    def turn(self, ids: list[int], params: DecodeParams, *, text: str = "", infill: bool = False,
             facts: Slots | None = None) -> TurnResult:
        r = super().turn(ids, params, text=text, infill=infill, facts=facts)
        said = narrative.narrative_input(self.tokenizer, ASIA, self.profile, drivers=True)[2]
        written = self.tokenizer.decode(r.tokens)
        shown = [x for x in corpus.largest_sentences(said, covers=False) if x in written]
        assert shown, written
        r.tokens = self.tokenizer.encode(written.replace(shown[0], corpus.largest_sentences(said, covers=True)[1]))
        return r


def test_a_share_of_the_whole_change_is_said_only_where_the_rows_sent_cover_it(
        session: Callable[[], LocalTurns], loaded: tuple[SetDLM, Tokenizer]) -> None:
    """At detail `full` over a partial breakdown the narrative says its drivers of the rows shown,
    verified; one that claims the largest part of the whole change is refused (unverified) on its
    first decode and its retry; over rows that cover the change the claim is the whole's."""
    spec = NarrativeSpec(payload=PayloadSpec.of(ASIA), detail="full")
    r = narrative.run(session(), spec)
    assert r["verified"] is True and r["attempt"] == "first" and r["facts_ok"] == r["facts_total"], r["text"]
    assert "Of the regions shown, " in r["text"] and "Korea, Dem. Rep." in r["text"].rpartition("shown, ")[2]
    assert "(1.1%)" in r["text"] or "1.1% of the change" in r["text"]
    turns = ClaimsTheWhole(*loaded)
    with pytest.raises(Unverified) as e:
        narrative.run(turns, spec)
    assert e.value.code == "unverified" and turns.turns == 2
    assert "drivers: a share of the whole change claimed, and the rows sent do not cover the change" in e.value.problems
    whole = narrative.run(session(), spec.model_copy(update={"payload": PayloadSpec.of(WHOLE_ASIA)}))
    assert whole["verified"] is True and "shown" not in whole["text"], whole["text"]


# ---- report ---------------------------------------------------------------------------------

def test_a_wrong_section_and_wrong_key_figures_are_decoded_again(loaded: tuple[SetDLM, Tokenizer]) -> None:
    spec = report_spec(1)
    data = spec.data.to_payload()
    old = data.metrics[0].value  # the first section's first number
    turns = Wrong(*loaded, wrong={0, 2}, old=old, new=data.metrics[0].prev)  # section 1; the key figures
    r = report.run(turns, spec)
    [s] = r["sections"]
    assert s["attempt"] == "ar_retry" and s["verified"] and s["facts_ok"] == s["facts_total"] and s["turn"] == 1
    f = r["figures"]
    assert f["attempt"] == "ar_retry" and f["verified"] and f["exact"] and f["turn"] == 3 and f["retried"]["problems"]
    assert [infill for _, _, infill in turns.calls] == [False, False, True, True]
    assert turns.calls[3][1].policy == "ar" and turns.calls[3][0] == turns.calls[2][0]
    assert r["verified"] is True and r["attempt"] == "ar_retry" and s["markdown"] in r["markdown"]
    assert turns.checks == {("section", "ar_retry"): 1, ("figures", "ar_retry"): 1}


def test_a_section_retry_that_the_plan_has_no_room_for_is_not_decoded(loaded: tuple[SetDLM, Tokenizer]) -> None:
    spec = long_report_spec(4, 2)  # 1871 of the 2048 positions, each part at most: a retry would starve the later ones
    old, new = spec.data.to_payload().metrics[0].value, spec.data.to_payload().metrics[0].prev
    turns = Wrong(*loaded, wrong={0}, old=old, new=new)
    with pytest.raises(Unverified) as e:
        report.run(turns, spec)
    assert turns.turns == 1 and "leave it" in e.value.problems[-1] and "Revenue" in e.value.message
    flagged = report.run(Wrong(*loaded, wrong={0}, old=old, new=new),
                         spec.model_copy(update={"allow_unverified": True}))
    assert [x["verified"] for x in flagged["sections"]] == [False] + [True] * 5 and flagged["verified"] is False
    assert flagged["attempt"] == "first" and flagged["figures"]["exact"]  # the later parts: all there


# ---- agent ----------------------------------------------------------------------------------

class Scripted:
    """Turns that answer each turn with the next scripted text (tokens), and keep what they were given."""

    def __init__(self, tok: Tokenizer, cfg: ModelConfig, script: list[str]) -> None:
        self.tokenizer, self.cfg, self.script = tok, cfg, script
        self.profile = Profile.for_model(cfg, tok)
        self.inputs: list[tuple[list[int], DecodeParams]] = []
        self.checks: list[tuple[str, str]] = []

    def turn(self, ids: list[int], params: DecodeParams, *, text: str = "", infill: bool = False,
             facts: Slots | None = None) -> TurnResult:
        self.inputs.append((ids, params))
        out = self.tokenizer.encode(self.script[len(self.inputs) - 1])
        end = self.tokenizer.token_id(END_CALL)
        tokens = out if out[-1:] == [end] else [*out, self.cfg.eos_id]
        return TurnResult("scripted", tokens, "warm", turn=len(self.inputs) - 1)

    def used(self) -> int:
        return 0

    def report(self, **progress: Any) -> None:
        pass

    def checked(self, part: str, outcome: str) -> None:
        self.checks.append((part, outcome))


CALL = f'{CALL}calc("40+2"){END_CALL}'


def test_an_answer_without_its_last_result_is_decoded_again_from_the_whole_document(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    model, tok = loaded
    turns = Scripted(tok, model.cfg, [CALL, "A: The result is 41.", "A: The result is 42."])
    r = agent.run(turns, AgentSpec(question="What is 40 + 2?"))
    assert r["verified"] is True and r["attempt"] == "ar_retry" and r["answer"] == "The result is 42."
    assert r["finished"] and r["reason"] == "answer" and r["text"].endswith("A: The result is 42.")
    assert "41" not in r["text"] and r["retried"]["problems"] == [
        "the answer states ['41'], not 42, the number the last call returned"]
    (q, _), (res, _), (again, p) = turns.inputs
    # the retry: the question, the call and its result as the turns wrote them, in one input that
    # starts a document (it cannot see the failed answer); greedy AR, a call still stops it
    assert again == q + tok.encode(CALL) + res and again[0] == model.cfg.doc_start_id
    assert p.policy == "ar" and [tok.token_id(END_CALL)] in p.stop
    assert len(r["turns"]) == 3 and turns.checks == [("answer", "ar_retry")]


def test_an_answer_wrong_twice_fails_unverified_or_comes_back_flagged(loaded: tuple[SetDLM, Tokenizer]) -> None:
    model, tok = loaded
    script = [CALL, "A: The result is 41.", "A: The result is 24."]
    with pytest.raises(Unverified) as e:
        agent.run(Scripted(tok, model.cfg, script), AgentSpec(question="What is 40 + 2?"))
    assert e.value.code == "unverified" and e.value.problems == [
        "the answer states ['24'], not 42, the number the last call returned"]
    turns = Scripted(tok, model.cfg, script)
    r = agent.run(turns, AgentSpec(question="What is 40 + 2?", allow_unverified=True))
    assert r["verified"] is False and r["answer"] == "The result is 24." and turns.checks == [("answer", "flagged")]


def test_an_answer_with_no_result_to_rest_on_is_decoded_again_then_fails_unverified(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    """No call made: the answer is checked all the same (never `verified: None`); its retry is the
    question alone, as a document of its own (tests/workflows/test_agent.py: flagged instead)."""
    model, tok = loaded
    turns = Scripted(tok, model.cfg, ["A: The result is 7.", "A: The result is 7."])  # an answer form
    with pytest.raises(Unverified) as e:
        agent.run(turns, AgentSpec(question="What is 3 + 4?"))
    assert e.value.code == "unverified" and e.value.problems == ["the answer rests on no result: no call was made"]
    (q, _), (again, p) = turns.inputs
    assert again == q and again[0] == model.cfg.doc_start_id and p.policy == "ar"
    assert turns.checks == [("answer", "unverified")]


def test_the_shipped_models_answer_is_verified_first(session: Callable[[], LocalTurns]) -> None:
    turns = session()
    r = agent.run(turns, AgentSpec(question=QUESTION, dataset_seed=DATA.seed))
    assert r["finished"] and r["verified"] is True and r["attempt"] == "first", r["text"]
    assert r["calls"][-1]["result"] in r["answer"] and turns.checks == {("answer", "first"): 1}


# ---- as a job: a rerun replays the retry --------------------------------------------------------

class Died(Exception):
    pass


def test_a_job_rerun_after_its_retry_replays_both_turns_and_counts_the_outcome_once(
        loaded: tuple[SetDLM, Tokenizer], client: redis.Redis, settings: Settings, tmp_path: Path) -> None:
    model, tok = loaded
    s = settings.model_copy(update={"data_dir": tmp_path, "job_lease_s": 0.3})
    sql = make_engine(s)
    records, jobs = Records(sql), Jobs(sql, s)
    engine = Engine(model, SessionStore(client, s), records, s)
    metrics = TurnMetrics(client, s)

    class WrongFirst(JobContext):
        """The job's first step reads wrong (as Wrong's turn 0), on every attempt."""

        def turn(self, ids: list[int], params: DecodeParams, *, text: str = "", infill: bool = False,
                 facts: Slots | None = None) -> TurnResult:
            step, r = self.step, super().turn(ids, params, text=text, infill=infill, facts=facts)
            if step == 0:
                r.tokens = swapped(tok, r.tokens, facts, "1240", "1105")
            return r

    def ctx_for(job_id: str) -> WrongFirst:
        claim = jobs.claim(job_id, "w1")
        assert claim.owner is not None, claim.reason
        return WrongFirst(claim, JobServices("w1", engine, tok, jobs, JobEvents(client, s), Routing(client, s)))

    sid = records.create_session("acme", "").id
    job, _ = jobs.create("narrative", "acme", SPEC.model_dump(), sid)
    first = ctx_for(job.id)
    counted = first.checked

    def dies_after_counting(part: str, outcome: str) -> None:
        counted(part, outcome)
        raise Died  # both turns are committed; the job row never finishes

    first.checked = dies_after_counting  # type: ignore[method-assign]
    with pytest.raises(Died):
        narrative.run(first, SPEC)
    first.close()
    time.sleep(0.4)
    [expired] = jobs.expired()
    assert jobs.requeue(expired)
    second = ctx_for(job.id)
    try:
        r = narrative.run(second, SPEC)
    finally:
        second.close()
    assert r["attempt"] == "ar_retry" and r["verified"] and r["path"] == "done" and r["retried"]["path"] == "done"
    assert [(t.job_id, t.job_step) for t in records.turns(sid, "acme")] == [(job.id, 0), (job.id, 1)]
    assert r["text"] == narrative.run(Wrong(*loaded, wrong={0}), SPEC)["text"]  # the uninterrupted run's
    assert metrics.read()["checked"] == {"narrative": {"ar_retry": 1}}  # not again for the replayed turns
    sql.dispose()
