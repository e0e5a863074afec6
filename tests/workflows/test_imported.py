"""Workflows end to end on an imported checkpoint (a released-layout Qwen3 SetDLM with a
Qwen-style tokenizer: BOS = EOS, the mask id past 150k), over a session in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from domain.facts import Slots
from domain.tools import CALL, END_CALL, END_RESULT, RESULT
from model import profiles, shipped
from model.importer import import_checkpoint
from model.params import DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import NoAnswer
from runtime.jobs.params import ParamsSpec
from runtime.jobs.payload import PayloadSpec
from runtime.jobs.specs import AgentSpec, NarrativeSpec, TurnSpec
from runtime.sessions.local import LocalTurns
from runtime.sessions.turn import TurnResult
from tests.model.released import ENDOFTEXT, IM_END, IM_START, MASK, qwen3_state, write_release
from tests.workflows.test_narrative import PAYLOAD
from workflows import agent, narrative, turn


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[SetDLM, Tokenizer, Path]:
    tmp = tmp_path_factory.mktemp("imported")
    import_checkpoint(write_release("hf_bin", qwen3_state(seed=4), tmp / "src"), tmp / "out")
    model, tok = shipped.load(tmp / "out")
    return model, tok, tmp / "out"


def test_a_turn_on_an_imported_model(imported: tuple[SetDLM, Tokenizer, Path]) -> None:
    model, tok, out = imported
    assert (model.cfg.mask_id, model.cfg.bos_id, model.cfg.eos_id) == (MASK, ENDOFTEXT, ENDOFTEXT)
    prompt = profiles.load(out, model.cfg, tok).render("turn", "the theory", tok)
    spec = TurnSpec(input_ids=prompt, params=ParamsSpec(policy="set", window=4, tau=0.5, max_new_tokens=12))
    r = turn.run(LocalTurns(model, tok), spec)
    assert 0 < len(r["tokens"]) <= 12 and MASK not in r["tokens"]
    assert r["text"] == tok.decode([t for t in r["tokens"] if t != ENDOFTEXT])


def test_a_narrative_on_an_imported_model(imported: tuple[SetDLM, Tokenizer, Path]) -> None:
    model, tok, _ = imported
    spec = NarrativeSpec(payload=PayloadSpec.of(PAYLOAD), allow_unverified=True,
                         params=ParamsSpec(policy="prefix", window=8, tau=0.9, max_new_tokens=16))
    r = narrative.run(LocalTurns(model, tok), spec)  # random weights: the text is noise, the job completes
    assert r["session"] == "local" and isinstance(r["text"], str) and r["tokens"] > 0


def test_an_agent_job_on_an_imported_model(imported: tuple[SetDLM, Tokenizer, Path]) -> None:
    model, tok, out = imported
    assert not tok.has_token(END_CALL) and len(tok.encode(END_CALL)) > 1  # no markup tokens
    spec = AgentSpec(question="What is 1 + 1?", max_calls=2, allow_unverified=True,
                     params=ParamsSpec(policy="prefix", window=4, tau=0.9, max_new_tokens=16))
    turns = LocalTurns(model, tok, profiles.load(out, model.cfg, tok))
    # random weights write noise, never an answer: the loop runs, then the job fails no_answer
    # (the call limit, a full session or a last segment with no "A:"), allow_unverified or not
    with pytest.raises(NoAnswer) as e:
        agent.run(turns, spec)
    assert e.value.code == "no_answer" and e.value.problems[0].startswith("no answer"), e.value.problems
    assert turns.turns >= 1 and turns.used() > 0  # decoded on the imported model's session


class Scripted(LocalTurns):
    """The imported model's turns, answered with scripted tokens; what each turn was asked, kept."""

    def __init__(self, model: SetDLM, tok: Tokenizer, profile: profiles.Profile, script: list[list[int]]) -> None:
        super().__init__(model, tok, profile)
        self.script = script
        self.asked: list[tuple[list[int], DecodeParams]] = []

    def turn(self, ids: list[int], params: DecodeParams, *, text: str = "", infill: bool = False,
             facts: Slots | None = None) -> TurnResult:
        self.asked.append((ids, params))
        return TurnResult("scripted", self.script[len(self.asked) - 1], "warm", turn=len(self.asked) - 1)


def test_the_agent_markup_is_multi_token_stop_sequences_on_a_vocabulary_without_it(
        imported: tuple[SetDLM, Tokenizer, Path]) -> None:
    model, tok, out = imported
    profile = profiles.load(out, model.cfg, tok)
    assert profile.stop == ["<|im_end|>"] and not profile.bos  # the chat template of a Qwen-style vocabulary
    script = [tok.encode(f'{CALL}calc("1+1"){END_CALL}'), [*tok.encode("A: 2"), IM_END]]
    turns = Scripted(model, tok, profile, script)
    r = agent.run(turns, AgentSpec(question="What is 1 + 1?"))
    (first, seg), (second, _) = turns.asked
    assert first[0] == IM_START and first[-1] != ENDOFTEXT  # ChatML around the question, no BOS
    assert tok.encode(END_CALL) in seg.stop and [IM_END] in seg.stop  # a call ends at its ids
    assert second == tok.encode(f"{RESULT}2{END_RESULT}\n")  # the result, as text
    assert r["calls"] == [{"id": "call_1", "call": 'calc("1+1")', "tool": "calc", "result": "2", "ok": True,
                           "by": "server"}]
    assert r["finished"] and r["reason"] == "answer" and r["answer"] == "2" and r["verified"] is True
