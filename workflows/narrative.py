"""One dashboard narrative from a metrics payload: a single short generation (high volume).

`narrate` is the plain function over a model (benchmarks, the model tour); `job` is the
`narrative` job kind: one turn on the job's session, the payload as its prompt."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from model.config import BOS_ID
from model.corpus import narrative as corpus
from model.params import DecodeParams
from model.decode import generate
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.jobs.context import JobContext
from runtime.jobs.specs import NarrativeSpec, check_spec
from workflows.turn import decode_params, session_of, summary


@dataclass
class NarrativeResult:
    text: str
    generated: int  # tokens written (EOS included)
    nfe: int  # forward passes, the prompt's prefill included
    seconds: float


def prompt_ids(tok: Tokenizer, payload: corpus.Payload) -> list[int]:
    return [BOS_ID, *tok.encode(corpus.prompt_text(payload))]


def narrate(model: SetDLM, tok: Tokenizer, payload: corpus.Payload, params: DecodeParams) -> NarrativeResult:
    t0 = time.perf_counter()
    out, _, state = generate(model, prompt_ids(tok, payload), params)
    new = [t for t in out if t != model.cfg.mask_id]
    return NarrativeResult(tok.decode(new, skip_special=True), len(new), state.nfe, time.perf_counter() - t0)


def job(ctx: JobContext, spec: dict[str, Any]) -> dict[str, Any]:
    s = check_spec("narrative", spec, ctx.job.session_id)
    assert isinstance(s, NarrativeSpec)
    payload = s.payload.to_payload()
    r = ctx.turn(session_of(ctx), prompt_ids(ctx.tokenizer, payload), decode_params(s.params),
                 text=corpus.prompt_text(payload))
    text = ctx.tokenizer.decode(r.tokens, skip_special=True)
    c = corpus.check(payload, text)  # the facts read back out of the text
    return {"session": r.session, "text": text, "facts_ok": c.facts_ok, "facts_total": c.facts_total,
            "problems": c.problems, "worker": ctx.worker, **summary(ctx, r)}
