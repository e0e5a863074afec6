"""The `agent` job kind: the model writes text and tool calls; at each `</call>` the tool runs and
`<result>...</result>` is appended by prefill, and decoding resumes from the cached state, until
the model ends its answer (EOS), the call limit is reached or the session is full.

Each decoding segment (up to a call, or the answer) is a turn of the session, the tool's result
the next turn's input, so a job's session resumes from its cached state (warm, or from Redis on
another worker) and can be read, forked or continued with another question.
Tools: workflows/tools.py (their semantics are model.corpus.agent's, as in training).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from model.corpus import agent as corpus
from model.params import DecodeError
from runtime.jobs.specs import AgentSpec
from workflows import tools
from workflows.turn import Turns, decode_params, summary


def run(turns: Turns, spec: AgentSpec) -> dict[str, Any]:
    """Answer spec.question with tools; the result has the transcript, the calls with their
    results, the answer, why it ended, and each turn's summary (resume path, nfe, timing)."""
    tok = turns.tokenizer
    end_call, eos = tok.token_id(corpus.END_CALL), turns.cfg.eos_id
    params = decode_params(spec.params)
    seg = replace(params, stop=[*params.stop, [end_call]])  # a segment ends at a call, or at EOS
    data = corpus.Dataset(spec.dataset_seed)
    text_in = corpus.prompt_text(spec.question)
    ids = [turns.cfg.bos_id, *tok.encode(text_in)]
    pieces: list[str] = []  # the assistant's side: segments and results
    calls: list[dict[str, Any]] = []
    done: list[dict[str, Any]] = []  # each turn's summary
    session, finished, reason = "", False, "length"
    while True:
        # 1) decode a segment: up to a call, the answer's EOS, or its token limit
        try:
            r = turns.turn(ids, seg, text=text_in)
        except DecodeError as e:
            if e.code != "context_overflow" or not done:
                raise
            reason = "context"  # the session is full: the answer so far, not a failed job
            break
        session = r.session
        done.append(summary(r))
        text = tok.decode(r.tokens, skip_special=True)
        pieces.append(text)
        if not r.tokens or r.tokens[-1] != end_call:  # EOS (the answer), or the segment's token limit
            finished = bool(r.tokens) and r.tokens[-1] == eos
            reason = "answer" if finished else "length"
            break
        if len(calls) == spec.max_calls:  # the call limit: this call is not run
            reason = "call_limit"
            break
        # 2) run the call; its result is the next turn's input
        call = tools.run_call(text.rsplit(corpus.CALL, 1)[-1].removesuffix(corpus.END_CALL), data)
        calls.append({"call": call.call.strip(), "tool": call.tool, "result": call.result, "ok": call.ok})
        text_in = f"{corpus.RESULT}{call.result}{corpus.END_RESULT}\n"
        pieces.append(text_in)
        ids = tok.encode(text_in)
        turns.report(calls=len(calls))
    transcript = "".join(pieces)
    answer = transcript.rsplit("A:", 1)[1].strip() if finished and "A:" in transcript else None
    return {"session": session, "question": spec.question, "text": transcript, "answer": answer, "calls": calls,
            "finished": finished, "reason": reason, "turns": done}
