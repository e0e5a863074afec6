"""The simplest jobs: one turn on a session (the input as token ids or text), and one infill
(a template whose `<hole>` markers are decoded in place).  Also the helpers every workflow
shares: decode parameters from their JSON, and a turn's summary for a job's result."""

from __future__ import annotations

from typing import Any

from model.params import DecodeError, DecodeParams
from runtime.sessions.turn import TurnResult
from runtime.errors import BadInput
from runtime.jobs.context import JobContext
from runtime.jobs.specs import HOLE, InfillSpec, ParamsSpec, TurnSpec, check_spec


def decode_params(p: ParamsSpec) -> DecodeParams:
    try:
        return DecodeParams(**p.model_dump())
    except DecodeError as e:
        raise BadInput(str(e)) from None


def summary(ctx: JobContext, r: TurnResult) -> dict[str, Any]:
    """What a result says of one turn: where it is, how the session was loaded, its costs."""
    return {"turn": r.turn, "path": r.path, "tokens": len(r.tokens), "nfe": r.nfe,
            "load_ms": round(1000 * r.costs.get("load_s", 0.0), 3),
            "decode_ms": round(1000 * r.costs.get("decode_s", 0.0), 3), "events": r.events}


def session_of(ctx: JobContext) -> str:
    if ctx.job.session_id is None:  # the spec check refuses such a job first
        raise BadInput(f"a {ctx.job.kind!r} job runs on a session")
    return ctx.job.session_id


def run(ctx: JobContext, spec: dict[str, Any]) -> dict[str, Any]:
    s = check_spec("turn", spec, ctx.job.session_id)
    assert isinstance(s, TurnSpec)
    ids = s.input_ids if s.input_ids is not None else ctx.tokenizer.encode(s.text or "")
    if not ids:
        raise BadInput("the input text encodes to no tokens")
    vocab = ctx.engine.model.cfg.vocab_size
    if any(not 0 <= t < vocab or t == ctx.engine.model.cfg.mask_id for t in ids):
        raise BadInput(f"input token ids must be real token ids in [0, {vocab})")
    r = ctx.turn(session_of(ctx), ids, decode_params(s.params), text=s.text or "")
    return {"session": r.session, "turn": r.turn, "tokens": r.tokens,
            "text": ctx.tokenizer.decode(r.tokens, skip_special=True), "path": r.path, "nfe": r.nfe,
            "costs": {k: round(v, 6) for k, v in r.costs.items()}, "events": r.events, "worker": ctx.worker}


def infill(ctx: JobContext, spec: dict[str, Any]) -> dict[str, Any]:
    """Every `<hole>` in the text is one masked token: the text around the holes (left and
    right) is the context; the holes are decoded in place and the filled text returned."""
    s = check_spec("infill", spec, ctx.job.session_id)
    assert isinstance(s, InfillSpec)
    tok, mask = ctx.tokenizer, ctx.engine.model.cfg.mask_id
    hole = tok.token_id(HOLE)
    ids = [mask if t == hole else t for t in tok.encode(s.text)]
    r = ctx.turn(session_of(ctx), ids, decode_params(s.params), text=s.text, infill=True)
    fill = iter(r.tokens)
    filled = [next(fill) if t == mask else t for t in ids]
    return {"session": r.session, "text": tok.decode(filled, skip_special=True),
            "holes": tok.decode(r.tokens, skip_special=True), "hole_tokens": r.tokens, "worker": ctx.worker,
            **summary(ctx, r)}
