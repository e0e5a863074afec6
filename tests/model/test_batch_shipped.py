"""model/batch.py on the shipped model: narratives (guided too) and guided agent calls, every policy, decode
the same tokens batched as alone (bit for bit where this machine's products are row-invariant:
tests/model/test_batch.py exact())."""

from __future__ import annotations

import copy
import random
import re
from dataclasses import replace

import pytest
import torch

from domain import agent
from domain import narrative as corpus
from domain.draws import make_payload, wild_payload
from domain.guide import CallNames
from domain.tools import CALL, END_CALL, END_RESULT, RESULT, call_text
from model import shipped
from model.params import DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from tests.model.test_batch import Run, Turn, alone, assert_same, exact
from workflows import narrative, structured, tools


@pytest.fixture(scope="module")
def loaded() -> tuple[SetDLM, Tokenizer]:
    return shipped.load()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_shipped_model_writes_the_same_narratives_batched(loaded: tuple[SetDLM, Tokenizer],
                                                              dtype: torch.dtype) -> None:
    """In bf16 too: the batched and the batch-1 forward must round alike (attention is the same
    call per sequence, model/batch.py), or a token drifts and the rest of its turn with it."""
    model, tok = copy.deepcopy(loaded[0]).to(dtype), loaded[1]
    if not exact(model):
        pytest.skip(f"this machine's {dtype} GEMM gives a row other bits in a larger product whatever the padding "
                    "(model/linear.py): batched decoding can only agree to rounding here")
    runs = []
    for i, (policy, W, tau) in enumerate([("ar", 1, None), ("prefix", 8, 0.99), ("set", 4, 0.9), ("block", 4, 0.9),
                                          ("prefix", 4, 0.9), ("set", 8, 0.7), ("ar", 1, None), ("prefix", 8, 0.99)]):
        payload = make_payload(random.Random(100 + i))  # payloads of different lengths
        ids = [model.cfg.bos_id, *tok.encode(corpus.prompt_text(payload))]
        runs.append(Run([Turn(ids, DecodeParams(policy=policy, window=W, tau=tau, max_new_tokens=120))], join=i))
    assert_same(model, runs)


def test_guided_agent_calls_on_the_shipped_model_are_the_same_batched(loaded: tuple[SetDLM, Tokenizer]) -> None:
    """The agent's guide (workflows/tools.py CallGuide) in one batch, every policy: each call as
    it is decoded alone.  The question is one whose second call the model alone miscopies, asked
    after its first call and result, its names written out (the slot model reads them as text: out
    of its training, it writes a name the question does not hold, "Xfitech 32" for "Xfers 32");
    the guide keeps each argument a copy of the question's text."""
    model, tok = loaded
    question = "How much higher was dc in dXqQjLuFRNQzcQq0umj than in Xfers 32 in 1993-H1?"
    text = (agent.prompt_text(question) + CALL + call_text("metric", "dc", "dXqQjLuFRNQzcQq0umj", "1993-H1")
            + END_CALL + RESULT + "577" + END_RESULT + "\n")
    ids = [model.cfg.bos_id, *tok.encode(text)]
    runs = []
    for i, (policy, W, tau) in enumerate([("ar", 1, None), ("prefix", 8, 0.99), ("set", 4, 0.9), ("block", 4, 0.9),
                                          ("prefix", 4, 0.9), ("set", 8, 0.7), ("ar", 1, None), ("prefix", 8, 0.9)]):
        p = DecodeParams(policy=policy, window=W, tau=tau, max_new_tokens=40 + 3 * i,
                         stop=[[tok.token_id(END_CALL)]], guide=tools.CallGuide(tok, CallNames(question)))
        runs.append(Run([Turn(ids, p)], join=i % 3))
    unguided = alone(model, Run([Turn(ids, replace(runs[0].turns[0].params, guide=None))])).tokens[0]
    guided = alone(model, runs[0]).tokens[0]
    args = [re.findall(r'"([^"]*)"', tok.decode(t[len(ids):])) for t in (unguided, guided)]
    assert len(args[0]) == len(args[1]) == 3, args
    assert not all(a in question for a in args[0]), args  # the guide has something to mend
    assert all(a in question for a in args[1]) and args[1] != args[0], args
    assert_same(model, runs)


def test_narratives_guided_to_their_forms_are_the_same_batched(loaded: tuple[SetDLM, Tokenizer]) -> None:
    """The narrative's guide (workflows/narrative.py FormGuide) in one batch, every policy: each
    narrative as it is decoded alone, and each one a text of its forms.  Payloads drawn from the
    API's grammar, where the model alone miswrites some (the guide has something to mend)."""
    model, tok = loaded
    if not exact(model):
        pytest.skip("this machine's GEMM gives a row other bits in a larger product (model/linear.py)")
    runs, forms = [], []
    for i, (policy, W, tau) in enumerate([("ar", 1, None), ("prefix", 8, 0.99), ("set", 4, 0.9), ("block", 4, 0.9),
                                          ("prefix", 8, 0.99), ("set", 8, 0.7), ("prefix", 8, 0.99)]):
        r = wild_payload(random.Random(300 + i)).render()
        forms.append(corpus.narrative_form(r))
        ids = [model.cfg.bos_id, *tok.encode(corpus.prompt_of(r))]
        runs.append(Run([Turn(ids, DecodeParams(policy=policy, window=W, tau=tau, max_new_tokens=200,
                                                guide=narrative.FormGuide(tok, forms[-1], model.cfg.eos_id)))], join=i % 3))
    assert_same(model, runs)
    mended = 0
    for run, form in zip(runs, forms):
        n = len(run.turns[0].ids)
        guided = alone(model, run).tokens[0][n:]
        assert guided[-1] == model.cfg.eos_id and corpus.pattern(form).fullmatch(tok.decode(guided[:-1])), tok.decode(guided)
        unguided = alone(model, Run([Turn(run.turns[0].ids, replace(run.turns[0].params, guide=None))])).tokens[0][n:]
        mended += unguided != guided
    assert mended, "the guide changed no narrative: the test tests nothing"


def test_json_documents_under_a_schema_are_the_same_batched(loaded: tuple[SetDLM, Tokenizer]) -> None:
    """The structured output's guide (workflows/structured/ JsonGuide: a JSON Schema's grammar)
    in one batch, every policy: each document as it is decoded alone, each one closed and valid
    against its schema; unguided, the model writes no JSON at all (the guide has everything to mend)."""
    model, tok = loaded
    if not exact(model):
        pytest.skip("this machine's GEMM gives a row other bits in a larger product (model/linear.py)")
    schema = {"type": "object", "properties": {"region": {"enum": ["AMER", "EMEA", "APAC"]}, "share": {"type": "number"},
                                               "note": {"type": "string", "maxLength": 20}},
              "required": ["region", "share"], "additionalProperties": False}
    fmt = structured.Format(schema)
    ids = [model.cfg.bos_id, *tok.encode("Which region grew the most in 2025-Q4?\n")]
    runs = []
    for i, (policy, W, tau) in enumerate([("ar", 1, None), ("prefix", 8, 0.99), ("set", 4, 0.9), ("block", 4, 0.9),
                                          ("prefix", 4, 0.9), ("set", 8, 0.7), ("ar", 1, None)]):
        p = DecodeParams(policy=policy, window=W, tau=tau, max_new_tokens=96,
                         guide=structured.JsonGuide(tok, model.cfg.vocab_size, model.cfg.eos_id, fmt))
        runs.append(Run([Turn(ids, p)], join=i % 3))
    assert_same(model, runs)
    for run in runs:
        out = alone(model, run).tokens[0][len(ids):]
        assert model.cfg.eos_id in out, tok.decode(out)
        doc = structured.document(tok.decode(out[:out.index(model.cfg.eos_id)]), fmt, ended=True)
        assert doc["region"] in ("AMER", "EMEA", "APAC")
    unguided = alone(model, Run([Turn(ids, replace(runs[0].turns[0].params, guide=None))])).tokens[0][len(ids):]
    assert not tok.decode(unguided).startswith("{")
