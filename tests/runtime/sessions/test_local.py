"""runtime/sessions/local.py: LocalTurns, the in-process runner, decodes what the engine does (the
same turns, the same tokens: greedy and sampled), holds one session in memory, and refuses what
the engine refuses without changing it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import redis

from domain import narrative, report
from domain.payload import Metric, Payload
from model import shipped
from model.params import DecodeError, DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.db import make_engine
from runtime.errors import BadInput
from runtime.sessions.engine import Engine
from runtime.sessions.local import LocalTurns
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings

PAYLOAD = Payload("Globex", "2026-Q3", "brief", [Metric("revenue", "1240", "1105", "1300")])


@pytest.fixture(scope="module")
def loaded() -> tuple[SetDLM, Tokenizer]:
    return shipped.load()


@pytest.fixture
def engine(loaded: tuple[SetDLM, Tokenizer], client: redis.Redis, settings: Settings, tmp_path: Path) -> Engine:
    s = settings.model_copy(update={"data_dir": tmp_path})
    return Engine(loaded[0], SessionStore(client, s), Records(make_engine(s)), s)


def _turns(model: SetDLM, tok: Tokenizer) -> list[tuple[list[int], bool]]:
    """A prompt, a follow-up, then an infill turn (a report template with mask_id at its holes)."""
    ids, hole = report.infill_tokens(tok, report.make_template(random.Random(0)))
    holed = [model.cfg.mask_id if h else x for x, h in zip(ids, hole)]
    first = [tok.bos_id, *tok.encode(narrative.prompt_text(PAYLOAD))]
    return [(first, False), (tok.encode("\nnarrative: "), False), (holed, True)]


@pytest.mark.parametrize("params", [DecodeParams(policy="set", window=4, tau=0.9, max_new_tokens=48),
                                    DecodeParams(policy="set", window=4, tau=0.5, max_new_tokens=24,
                                                 temperature=0.8, seed=3)], ids=["greedy", "sampled"])
def test_local_turns_give_the_engines_tokens(engine: Engine, loaded: tuple[SetDLM, Tokenizer],
                                             params: DecodeParams) -> None:
    model, tok = loaded
    sid = engine.open("acme")
    want = [engine.run_turn(sid, "acme", ids, params, infill=infill) for ids, infill in _turns(model, tok)]
    local = LocalTurns(model, tok)
    assert (local.tokenizer, local.cfg, local.used()) == (tok, model.cfg, 0)
    got = [local.turn(ids, params, infill=infill, text="x") for ids, infill in _turns(model, tok)]
    assert [r.tokens for r in got] == [r.tokens for r in want] and all(r.tokens for r in got)
    assert [(r.path, r.turn) for r in got] == [("new", 0), ("warm", 1), ("warm", 2)]
    assert len(got[2].tokens) == _turns(model, tok)[2][0].count(model.cfg.mask_id), "the holes, in position order"
    assert [r.nfe for r in got] == [r.nfe for r in want], "forward passes of each turn, on both"
    assert all(r.nfe > 0 and r.costs["decode_s"] > 0 for r in got)
    assert local.used() == engine.records.length(sid, "acme"), "the positions the session holds"


def test_a_refused_turn_leaves_the_session_as_it_was(loaded: tuple[SetDLM, Tokenizer]) -> None:
    model, tok = loaded
    params = DecodeParams(policy="prefix", window=8, tau=0.99, max_new_tokens=16)
    (first, _), (second, _), _ = _turns(model, tok)
    local, ref = LocalTurns(model, tok), LocalTurns(model, tok)
    local.turn(first, params)
    ref.turn(first, params)
    used = local.used()
    with pytest.raises(DecodeError, match="context"):
        local.turn(second, DecodeParams(max_new_tokens=model.cfg.max_seq_len))
    for bad in ([], second):  # nothing to decode; an infill turn without a hole
        with pytest.raises(BadInput):
            local.turn(bad, params, infill=bool(bad))
    assert local.used() == used
    assert local.turn(second, params).tokens == ref.turn(second, params).tokens
    local.report(section=1, of=3)
    local.report(section=2)
    assert local.progress == {"section": 2, "of": 3}
