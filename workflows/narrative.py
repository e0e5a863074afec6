"""The `narrative` job kind: one dashboard narrative from a metrics payload, a single turn with
the payload as its prompt (high volume); the facts read back out of the text."""

from __future__ import annotations

from typing import Any

from model.corpus import narrative as corpus
from model.tokenizer import Tokenizer
from runtime.jobs.specs import NarrativeSpec
from workflows.turn import Turns, decode_params, summary


def prompt_ids(tok: Tokenizer, payload: corpus.Payload) -> list[int]:
    return [tok.bos_id, *tok.encode(corpus.prompt_text(payload))]


def run(turns: Turns, spec: NarrativeSpec) -> dict[str, Any]:
    tok, payload = turns.tokenizer, spec.payload.to_payload()
    r = turns.turn(prompt_ids(tok, payload), decode_params(spec.params), text=corpus.prompt_text(payload))
    text = tok.decode(r.tokens, skip_special=True)
    c = corpus.check(payload, text)  # the facts read back out of the text
    return {"session": r.session, "text": text, "facts_ok": c.facts_ok, "facts_total": c.facts_total,
            "problems": c.problems, **summary(r)}
