"""The simplest job: one turn on a session (the input as token ids or text, decode parameters as
JSON); its result is the generated tokens and text, and how the session was loaded."""

from __future__ import annotations

from typing import Any

from model.decode import DecodeError, DecodeParams
from runtime.errors import BadInput
from runtime.job_context import JobContext
from runtime.schemas import TurnSpec, check_spec


def run(ctx: JobContext, spec: dict[str, Any]) -> dict[str, Any]:
    s = check_spec("turn", spec, ctx.job.session_id)
    assert isinstance(s, TurnSpec) and ctx.job.session_id is not None
    ids = s.input_ids if s.input_ids is not None else ctx.tokenizer.encode(s.text or "")
    if not ids:
        raise BadInput("the input text encodes to no tokens")
    vocab = ctx.engine.model.cfg.vocab_size
    if any(not 0 <= t < vocab for t in ids):
        raise BadInput(f"input token ids must be in [0, {vocab})")
    try:
        params = DecodeParams(**s.params.model_dump())
    except DecodeError as e:
        raise BadInput(str(e)) from None
    r = ctx.turn(ctx.job.session_id, ids, params, text=s.text or "")
    return {"session": r.session, "turn": r.turn, "tokens": r.tokens,
            "text": ctx.tokenizer.decode(r.tokens, skip_special=True), "path": r.path, "nfe": r.nfe,
            "costs": {k: round(v, 6) for k, v in r.costs.items()}, "events": r.events, "worker": ctx.worker}
