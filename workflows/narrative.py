"""The `narrative` job kind: one dashboard narrative from a metrics payload, a single turn with
the payload as its prompt (high volume).  The model points at facts (slots) and the runtime
writes them (runtime/jobs/plans.py written_out); what the model wrote is read back before the
text is returned (workflows/checked.py: a narrative that fails is decoded again, greedy AR).
The result carries the payload's chart (a Vega-Lite spec) and drivers, computed from the payload,
never from the model's text."""

from __future__ import annotations

from typing import Any

from domain import charts, drivers
from domain import narrative as corpus
from domain.payload import Payload
from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.jobs.plans import DEFAULT, narrative_input, slot_form, written_out
from runtime.jobs.specs import NarrativeSpec
from runtime.sessions.turn import TurnResult
from workflows.checked import Retry, check
from workflows.turn import Turns, decode_params, summary, text_of, with_stops


def prompt_ids(tok: Tokenizer, payload: Payload, profile: Profile = DEFAULT) -> list[int]:
    """The prompt as the model's profile renders it (setflow's models: [BOS] payload narrative:)."""
    return narrative_input(tok, payload, profile)[0]


def problems(c: corpus.Check) -> list[str]:
    """What a fact check found wrong; [] only when it is fully correct."""
    return c.problems or ([] if c.fully_correct else [f"{c.facts_ok} of {c.facts_total} facts right"])


def run(turns: Turns, spec: NarrativeSpec) -> dict[str, Any]:
    tok, profile = turns.tokenizer, turns.profile
    payload = spec.payload.to_payload()
    ids, text_in, facts = narrative_input(tok, payload, profile)
    params = with_stops(turns, decode_params(spec.params))

    def read(r: TurnResult) -> tuple[tuple[str, corpus.Check], list[str]]:
        written = text_of(turns, r.tokens)
        c = corpus.read_back(facts, slot_form(profile, facts.slots, written))  # every sentence, every slot
        return (written_out(profile, facts.slots, written), c), problems(c)

    done = check(turns, "narrative", turns.turn(ids, params, text=text_in, facts=facts.slots), read,
                 Retry(ids, params, text_in, facts=facts.slots),
                 allow_unverified=spec.allow_unverified)
    text, c = done.value
    return {"session": done.turn.session, "text": text, "facts_ok": c.facts_ok, "facts_total": c.facts_total,
            **summary(done.turn), **done.fields(), "chart": charts.chart(payload, f"{payload.tenant}, {payload.period}"),
            "drivers": drivers.drivers(payload), "detail": spec.detail, "audience": spec.audience}
