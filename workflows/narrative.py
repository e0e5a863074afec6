"""The `narrative` job kind: one dashboard narrative from a metrics payload, a single turn with
the payload as its prompt (high volume).  The model points at facts (slots) and the runtime
writes them (workflows/turn.py written_out); what the model wrote is read back before the
text is returned (workflows/checked.py: a narrative that fails is decoded again, greedy AR).
The result carries the payload's chart (a Vega-Lite spec) and drivers, computed from the payload,
never from the model's text.  At detail `full` the text says the breakdown's drivers too: the
model reads them as facts (slots) and phrases them (domain/narrative.py drivers_form).  With a
`format`, a JSON document too, written after the text under its grammar (workflows/structured/
written: valid, and its numbers those the text states)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from domain import charts, drivers
from domain import narrative as corpus
from domain.drivers import rendered
from domain.facts import Slots
from domain.payload import Payload, Rendered
from model.params import DecodeParams
from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.jobs.specs import NarrativeSpec
from runtime.sessions.turn import TurnResult
from workflows import structured
from workflows.checked import Retry, check
from workflows.turn import DEFAULT, Turns, decode_params, facts_table, readable, slot_form, summary, text_of, with_stops, written_out

LONGEST_SLACK = 8  # tokens: a text encoded whole may split otherwise at a join than its pieces alone


def narrative_input(tok: Tokenizer, payload: Payload, profile: Profile = DEFAULT, drivers: bool = False
                    ) -> tuple[list[int], str, Rendered]:
    """A narrative's prompt: the profile's `narrative` format around the payload (ids, the text
    as the model reads it, the payload's facts); drivers: the breakdown's too (detail `full`)."""
    r = rendered(payload, facts_table(profile), drivers)
    text = readable(profile, r.slots, corpus.prompt_of(r))
    return profile.render("narrative", text, tok), text, r


def longest(tok: Tokenizer, form: corpus.Form, profile: Profile, slots: Slots) -> int:
    """Tokens of the longest text `form` writes, as the profile's model writes it, with its EOS: an
    upper bound (each choice's longest alternative encoded alone, and a few for merges that differ
    across the joins).  A part never needs more; a report plans each section with no more."""
    return sum(max(len(tok.encode(readable(profile, slots, a))) for a in alts) for alts in form) + 1 + LONGEST_SLACK


def planned(spec: NarrativeSpec, tok: Tokenizer, profile: Profile = DEFAULT) -> int:
    """A narrative's plan (workflows.PLANS): its prompt and what it may decode, and its document's."""
    ids = narrative_input(tok, spec.payload.to_payload(), profile, drivers=spec.drivers)[0]
    return len(ids) + spec.params.max_new_tokens + structured.document_positions(spec.format, tok, profile)


def prompt_ids(tok: Tokenizer, payload: Payload, profile: Profile = DEFAULT) -> list[int]:
    """The prompt as the model's profile renders it (setflow's models: [BOS] payload narrative:)."""
    return narrative_input(tok, payload, profile)[0]


def problems(c: corpus.Check) -> list[str]:
    """What a fact check found wrong; [] only when it is fully correct."""
    return c.problems or ([] if c.fully_correct else [f"{c.facts_ok} of {c.facts_total} facts right"])


class FormGuide:
    """The decoder's guide (model.params.Guide) for a narrative or a report section: a token is
    refused where the text would stop being the beginning of one the narrative's forms write for
    its payload (domain/narrative.py begins: the facts' slots in their places, the trend and
    target words the payload implies, nothing else), and EOS until the text is a whole one; the
    model's most probable allowed token is taken instead.  The model still chooses the phrasing
    and where each choice falls; the checker still reads the text back.  For setflow's own
    models (slots): a text model's names are copied text, not the forms' literals.  A pure
    function of the region's tokens: the same on every worker, batched or not."""

    def __init__(self, tok: Tokenizer, form: corpus.Form, eos_id: int) -> None:
        self._tok, self._form, self._whole, self._eos = tok, form, corpus.pattern(form), eos_id
        self._last: tuple[tuple[int, ...], str] = ((), "")  # the text before: a refused position asks about many tokens

    def allows(self, before: Sequence[int], token: int) -> bool | None:
        if self._eos in before:  # past the end: the decoder cuts there
            return None
        key = tuple(before)
        last = self._last  # one read: the batcher's loop and a job's thread may both ask
        so_far = last[1] if last[0] == key else self._tok.decode(list(before))
        self._last = (key, so_far)
        if token == self._eos:
            return self._whole.fullmatch(so_far) is not None
        text = self._tok.decode([*before, token])
        # a token that writes nothing (an id the tokenizer does not write out) is no way on: a
        # model stuck on one would fill its max_new_tokens and never end the text
        return text != so_far and corpus.begins(self._form, text)


def guide(turns: Turns, params: DecodeParams, form: corpus.Form, guided: bool) -> DecodeParams:
    """params guided to `form` (FormGuide) where asked and the model writes slots; else as they are."""
    if not guided or turns.profile.facts != "slots":
        return params
    return replace(params, guide=FormGuide(turns.tokenizer, form, turns.cfg.eos_id))


def run(turns: Turns, spec: NarrativeSpec) -> dict[str, Any]:
    tok, profile = turns.tokenizer, turns.profile
    payload = spec.payload.to_payload()
    ids, text_in, facts = narrative_input(tok, payload, profile, drivers=spec.drivers)
    params = guide(turns, with_stops(turns, decode_params(spec.params)), corpus.narrative_form(facts), spec.guided)

    def read(r: TurnResult) -> tuple[tuple[str, corpus.Check], list[str]]:
        written = text_of(turns, r.tokens)
        c = corpus.read_back(facts, slot_form(profile, facts.slots, written))  # every sentence, every slot
        return (written_out(profile, facts.slots, written), c), problems(c)

    done = check(turns, "narrative", turns.turn(ids, params, text=text_in, facts=facts.slots), read,
                 Retry(ids, params, text_in, facts=facts.slots),
                 allow_unverified=spec.allow_unverified)
    text, c = done.value
    out = {"session": done.turn.session, "text": text, "facts_ok": c.facts_ok, "facts_total": c.facts_total,
           **summary(done.turn), **done.fields(), "chart": charts.chart(payload, f"{payload.tenant}, {payload.period}"),
           "drivers": drivers.drivers(payload), "detail": spec.detail, "audience": spec.audience}
    if (fmt := structured.Format.of(spec.format)) is not None:  # its document, after the text (checked)
        out["document"] = structured.written(turns, fmt, text, decode_params(spec.params))
    return out
