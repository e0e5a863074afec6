"""The Turns seam every workflow is written over, and the simplest jobs on it: one turn (the input
as token ids or text) and one infill (a template whose `<hole>` markers are decoded in place).
Also the helpers every workflow shares: decode parameters from their JSON, a turn's summary, a
fill.  Who runs the turns (a job's session, or a session in this process) is not known here."""

from __future__ import annotations

from typing import Any, Protocol

from model.config import ModelConfig
from model.params import DecodeError, DecodeParams
from model.tokenizer import Tokenizer
from runtime.errors import BadInput
from runtime.jobs.specs import HOLE, InfillSpec, ParamsSpec, TurnSpec
from runtime.sessions.turn import TurnResult


class Turns(Protocol):
    """One session's turns, as a workflow sees them: the job context's (runtime/jobs/context.py,
    the job's session in Redis and SQL) or the in-process runner's (runtime/sessions/local.py)."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def cfg(self) -> ModelConfig:
        """The model's: bos_id, eos_id, mask_id, vocab_size, max_seq_len (read-only members: a
        plain attribute satisfies them too)."""
        ...

    def turn(self, ids: list[int], params: DecodeParams, *, text: str = "", infill: bool = False) -> TurnResult:
        """Append `ids` to the session and decode after them (infill: `ids` holds mask_id at
        holes, decoded in place); text: the input as rendered, for the session's record."""
        ...

    def used(self) -> int:
        """Positions the session holds before this job's own turns."""
        ...

    def report(self, **progress: Any) -> None:
        """Progress for whoever watches (sections done, calls made)."""
        ...


def decode_params(p: ParamsSpec) -> DecodeParams:
    try:
        return DecodeParams(**p.model_dump())
    except DecodeError as e:
        raise BadInput(str(e)) from None


def summary(r: TurnResult) -> dict[str, Any]:
    """What a result says of one turn: where it is, how the session was loaded, its costs."""
    return {"turn": r.turn, "path": r.path, "tokens": len(r.tokens), "nfe": r.nfe,
            "load_ms": round(1000 * r.costs.get("load_s", 0.0), 3),
            "decode_ms": round(1000 * r.costs.get("decode_s", 0.0), 3), "events": r.events}


def fill(turns: Turns, masked: list[int], params: DecodeParams, text: str = "") -> tuple[list[int], TurnResult]:
    """One infill turn: `masked` holds mask_id at the holes; returns it filled, and the turn."""
    mask = turns.cfg.mask_id
    r = turns.turn(masked, params, text=text, infill=True)
    holes = iter(r.tokens)  # the holes' tokens, in position order
    return [next(holes) if t == mask else t for t in masked], r


def run(turns: Turns, spec: TurnSpec) -> dict[str, Any]:
    tok, cfg = turns.tokenizer, turns.cfg
    ids = spec.input_ids if spec.input_ids is not None else tok.encode(spec.text or "")
    if not ids:
        raise BadInput("the input text encodes to no tokens")
    if any(not 0 <= t < cfg.vocab_size or t == cfg.mask_id for t in ids):
        raise BadInput(f"input token ids must be real token ids in [0, {cfg.vocab_size})")
    r = turns.turn(ids, decode_params(spec.params), text=spec.text or "")
    return {"session": r.session, "turn": r.turn, "tokens": r.tokens, "text": tok.decode(r.tokens, skip_special=True),
            "path": r.path, "nfe": r.nfe, "costs": {k: round(v, 6) for k, v in r.costs.items()}, "events": r.events}


def infill(turns: Turns, spec: InfillSpec) -> dict[str, Any]:
    """Every `<hole>` in the text is one masked token: the text around the holes (left and
    right) is the context; the holes are decoded in place and the filled text returned."""
    tok, hole = turns.tokenizer, turns.tokenizer.token_id(HOLE)
    masked = [turns.cfg.mask_id if t == hole else t for t in tok.encode(spec.text)]
    filled, r = fill(turns, masked, decode_params(spec.params), text=spec.text)
    return {"session": r.session, "text": tok.decode(filled, skip_special=True),
            "holes": tok.decode(r.tokens, skip_special=True), "hole_tokens": r.tokens, **summary(r)}
