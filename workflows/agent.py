"""The agent loop: the model writes text and tool calls; at each `</call>` the runtime runs the
tool, appends `<result>...</result>` by prefill, and decoding resumes from the cached state, until
the model ends its answer (EOS) or the call limit is reached.

`run` is the loop over a bare model and cache (benchmarks, the model tour); `job` is the `agent`
job kind: each decoding segment (up to a call, or the answer) is a turn of the job's session,
the tool's result the next turn's input, so the session resumes from its cached state (warm, or
from Redis on another worker) and can be read, forked or continued with another question.
Tools: workflows/tools.py (their semantics are model.corpus.agent's, as in training).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from model.config import BOS_ID
from model.corpus import agent as tools
from model.params import DecodeError, DecodeParams, DecodeState
from model.decode import begin_turn, decode
from model.kv_cache import KVCache
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.jobs.context import JobContext
from runtime.jobs.specs import AgentSpec, check_spec
from workflows import tools as tool_calls
from workflows.turn import decode_params, session_of, summary

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
        if len(out.calls) == max_calls:  # the call limit: this call is not run
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


def job(ctx: JobContext, spec: dict[str, Any]) -> dict[str, Any]:
    """Answer spec.question with tools; the result has the transcript, the calls with their
    results, the answer, and each turn's resume path and timing."""
    s = check_spec("agent", spec, ctx.job.session_id)
    assert isinstance(s, AgentSpec)
    session, tok = session_of(ctx), ctx.tokenizer
    end_call, eos = tok.token_id(tools.END_CALL), ctx.engine.model.cfg.eos_id
    params = decode_params(s.params)
    seg = replace(params, stop=[*params.stop, [end_call]])  # a segment ends at a call, or at EOS
    data = tools.Dataset(s.dataset_seed)
    ids, text_in = [BOS_ID, *tok.encode(tools.prompt_text(s.question))], tools.prompt_text(s.question)
    pieces: list[str] = []
    calls: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    finished, reason = False, "length"
    while True:
        try:
            r = ctx.turn(session, ids, seg, text=text_in)
        except DecodeError as e:
            if e.code != "context_overflow" or not turns:
                raise
            reason = "context"  # the session is full: the answer so far, not a failed job
            break
        turns.append(summary(ctx, r))
        text = tok.decode(r.tokens, skip_special=True)
        pieces.append(text)
        if not r.tokens or r.tokens[-1] != end_call:  # EOS (the answer), or the segment's token limit
            finished = bool(r.tokens) and r.tokens[-1] == eos
            reason = "answer" if finished else "length"
            break
        if len(calls) == s.max_calls:
            reason = "call_limit"
            break
        call = tool_calls.run_call(text.rsplit(tools.CALL, 1)[-1].removesuffix(tools.END_CALL), data)
        calls.append({"call": call.call.strip(), "tool": call.tool, "result": call.result, "ok": call.ok})
        text_in = f"{tools.RESULT}{call.result}{tools.END_RESULT}\n"  # appended by prefill
        pieces.append(text_in)
        ids = tok.encode(text_in)
        ctx.report(calls=len(calls))
    transcript = "".join(pieces)
    answer = transcript.rsplit("A:", 1)[1].strip() if finished and "A:" in transcript else None
    return {"session": session, "question": s.question, "text": transcript, "answer": answer, "calls": calls,
            "finished": finished, "reason": reason, "turns": turns, "worker": ctx.worker}
