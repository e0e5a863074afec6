"""The agent loop: the model writes text and tool calls; at each `</call>` the runtime runs the
tool, appends `<result>...</result>` by prefill, and decoding resumes from the cached state, until
the model ends its answer (EOS) or the call limit is reached.

Plain functions over a model and a tokenizer; no Celery, no storage (the engine and the API wrap
this later).  Tool semantics: model.corpus.agent (the corpus the model was trained on uses the
same ones, so results look exactly as in training).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from model.config import BOS_ID
from model.corpus import agent as tools
from model.decode import DecodeParams, DecodeState, begin_turn, decode
from model.kv_cache import KVCache
from model.tokenizer import Tokenizer
from model.transformer import SetDLM

MAX_CALLS = 6  # tool calls per question before the loop gives up
SEGMENT_TOKENS = 96  # masks opened per decoding segment (a call, or the final answer)


@dataclass
class AgentResult:
    text: str  # the assistant's side: calls, results, answer
    calls: list[str] = field(default_factory=list)  # the call texts, in order
    results: list[str] = field(default_factory=list)  # what each call returned
    finished: bool = False  # the model ended its answer (EOS) within the call limit
    generated: int = 0  # tokens the model wrote (results excluded)
    nfe: int = 0  # forward passes, prefills of the prompt and results included
    seconds: float = 0.0


def run(model: SetDLM, tok: Tokenizer, question: str, data: tools.Dataset, params: DecodeParams,
        max_calls: int = MAX_CALLS) -> AgentResult:
    """Answer `question` with tools over `data`.  params.max_new_tokens bounds each segment."""
    t0 = time.perf_counter()
    end_call = tok.token_id(tools.END_CALL)
    seg = replace(params, stop=[*params.stop, [end_call]])
    w = next(model.parameters())
    cache = KVCache.for_model(model.cfg, dtype=w.dtype, device=w.device)
    ids = [BOS_ID, *tok.encode(tools.prompt_text(question))]
    state: DecodeState | None = None
    out = AgentResult(text="")
    pieces: list[str] = []
    for _ in range(max_calls + 1):
        state = begin_turn(model, cache, state, ids, seg)
        start = state.start
        for _ev in decode(model, cache, state, seg):
            pass
        new = [t for t in state.tokens[start:] if t != model.cfg.mask_id]
        out.generated += len(new)
        text = tok.decode(new, skip_special=True)
        pieces.append(text)
        if not new or new[-1] != end_call:  # EOS, or the segment's token limit
            out.finished = bool(new) and new[-1] == model.cfg.eos_id
            break
        call = text.rsplit(tools.CALL, 1)[-1].removesuffix(tools.END_CALL)
        result = tools.run_call(call, data)
        out.calls.append(call.strip())
        out.results.append(result)
        appended = f"{tools.RESULT}{result}{tools.END_RESULT}\n"
        pieces.append(appended)
        ids = tok.encode(appended)
    assert state is not None
    out.text = "".join(pieces)
    out.nfe = state.nfe
    out.seconds = time.perf_counter() - t0
    return out
