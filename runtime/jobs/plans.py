"""What a job will append to its session, in tokens, known before it runs (no torch): the
report's section prompts and its key-figures template, a narrative's prompt, a turn's input.
The worker decodes exactly these inputs; the API checks, before it accepts a job, that they fit
the model's context after what the session holds already (a report refused at its fourth
section, after three turns of work, is a 422 at submission instead).

Each report section's input ends with its heading, "## {title}\\n" (the first line of the
section as the model was trained to write it): the title is the user's, verbatim, and the
model writes the body.

Facts enter as the model's profile says (Profile.facts): as slot tokens, whose table each input
returns beside its ids (domain/facts.py: the workflow lexicalises what the model writes with
it), or written out, for a model that copies them (its text is read back into the same slots)."""

from __future__ import annotations

from dataclasses import replace

from domain import agent as agent_corpus
from domain import narrative as corpus
from domain.drivers import rendered
from domain.facts import Slots
from domain.payload import Payload, Rendered
from domain.report import HOLE, Section, Template, infill_tokens, template
from model.config import ModelConfig
from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.errors import BadInput
from runtime.jobs.specs import HOLE as HOLE_MARK
from runtime.jobs.specs import InfillSpec, NarrativeSpec, ReportSpec, ResponseSpec, TurnSpec

assert HOLE == HOLE_MARK


def section_payload(data: Payload, keys: list[str]) -> Payload:
    """The data one section is written from: its metrics (in outline order), and the breakdown
    when it breaks one of them down (as in training, where a section has at most two metrics)."""
    by_key = {m.key: m for m in data.metrics}
    b = data.breakdown if data.breakdown is not None and data.breakdown.metric in keys else None
    return Payload(data.tenant, data.period, data.style, [by_key[k] for k in keys], b)


DEFAULT = Profile()  # setflow's own models' profile: BOS, then the prompt as it is; no extra stops


def facts_table(profile: Profile) -> Slots:
    """An input's empty slot table (one slot per distinct text where the model writes facts as text)."""
    return Slots(dedup=profile.facts == "text")


def readable(profile: Profile, slots: Slots, text: str) -> str:
    """An input in slot form as the profile's model reads it: its slots, or its facts written out."""
    return text if profile.facts == "slots" else slots.lexicalise(text)


def slot_form(profile: Profile, slots: Slots, written: str) -> str:
    """What the model wrote, in slot form for the checkers (a text model's facts read back)."""
    return written if profile.facts == "slots" else slots.delexicalise(written)


def written_out(profile: Profile, slots: Slots, written: str) -> str:
    """What the model wrote, with its facts written out: what the job returns."""
    return slots.lexicalise(written) if profile.facts == "slots" else written


def section_input(tok: Tokenizer, title: str, payload: Payload, profile: Profile = DEFAULT
                  ) -> tuple[list[int], str, Rendered]:
    """The profile's `report` format around <section>title / payload</section>, then "## title\\n"
    (setflow's models: [BOS] <section>[F1] ... </section> ## [F1]\\n): ids, the text as the
    model reads it, and the section's facts (Section.render: the title is the first)."""
    prompt, title_slot, r = Section(title, payload).render(facts_table(profile))
    head = readable(profile, r.slots, f"## {title_slot}\n")
    prompt = readable(profile, r.slots, prompt)
    return profile.render("report", prompt, tok) + tok.encode(head), prompt + head, r


LONGEST_SLACK = 8  # tokens: a text encoded whole may split otherwise at a join than its pieces alone


def longest(tok: Tokenizer, form: corpus.Form, profile: Profile, slots: Slots) -> int:
    """Tokens of the longest text `form` writes, as the profile's model writes it, with its EOS: an
    upper bound (each choice's longest alternative encoded alone, and a few for merges that differ
    across the joins).  A part never needs more; a report plans each section with no more."""
    return sum(max(len(tok.encode(readable(profile, slots, a))) for a in alts) for alts in form) + 1 + LONGEST_SLACK


def section_tokens(tok: Tokenizer, facts: Rendered, cap: int, profile: Profile = DEFAULT) -> int:
    """What a section may decode: the report's max_new_tokens, or less where its longest body is
    shorter (a report of six sections, one of them with 12 breakdown rows, then fits the context)."""
    return min(cap, longest(tok, corpus.narrative_form(facts), profile, facts.slots))


def narrative_input(tok: Tokenizer, payload: Payload, profile: Profile = DEFAULT, drivers: bool = False
                    ) -> tuple[list[int], str, Rendered]:
    """A narrative's prompt: the profile's `narrative` format around the payload (ids, the text
    as the model reads it, the payload's facts); drivers: the breakdown's too (detail `full`)."""
    r = rendered(payload, facts_table(profile), drivers)
    text = readable(profile, r.slots, corpus.prompt_of(r))
    return profile.render("narrative", text, tok), text, r


def agent_input(tok: Tokenizer, question: str, profile: Profile = DEFAULT) -> list[int]:
    """An agent's first input: the profile's `agent` format around the question."""
    return profile.render("agent", agent_corpus.prompt_text(question), tok)


def turn_input(profile: Profile, tok: Tokenizer, text: str) -> list[int]:
    """A turn's text input: the profile's `turn` format around it, no BOS (a turn continues its
    session; setflow's models: the text's ids as they are)."""
    return profile.render("turn", text, tok, bos=False) if text else []


def report_template(tok: Tokenizer, data: Payload, mask_id: int, profile: Profile = DEFAULT
                    ) -> tuple[list[int], list[int], str, Slots]:
    """The key figures: (the template's ids with mask_id at the holes, the same filled with the
    answers the data fixes, its text with <hole> markers, its facts)."""
    t = template(replace(data, breakdown=None), facts_table(profile))
    slots = t.rendered.slots
    t = Template(t.rendered, [(readable(profile, slots, x), h) for x, h in t.pieces],
                 readable(profile, slots, t.context_text()))
    ids, hole = infill_tokens(tok, t)
    return [mask_id if h else x for x, h in zip(ids, hole)], ids, t.context_text() + t.text(hole=HOLE), slots


def positions(kind: str, spec: object, tok: Tokenizer, profile: Profile = DEFAULT) -> int:
    """Positions the job appends to its session at most (inputs + tokens it may decode); 0 for
    kinds whose length depends on what the model writes (an agent's tool results, a response
    with tools: an agent whose session fills up before its answer fails with code "no_answer")."""
    if isinstance(spec, ReportSpec):
        return sum(report_parts(spec, tok, profile))
    if isinstance(spec, NarrativeSpec):
        ids = narrative_input(tok, spec.payload.to_payload(), profile, drivers=spec.drivers)[0]
        return len(ids) + spec.params.max_new_tokens
    if isinstance(spec, TurnSpec):
        n = len(spec.input_ids) if spec.input_ids is not None else len(turn_input(profile, tok, spec.text or ""))
        return n + spec.params.max_new_tokens
    if isinstance(spec, InfillSpec):
        return len(tok.encode(spec.text))
    if isinstance(spec, ResponseSpec) and spec.mode == "text":  # its input as setflow's own models read it
        # (workflows/responses.py); an imported model's (maybe a chat template) is not counted: a bound below
        n = len(turn_input(profile, tok, spec.text or "")) if profile.facts == "slots" else 0
        return n + spec.params.max_new_tokens
    return 0


def report_parts(spec: ReportSpec, tok: Tokenizer, profile: Profile = DEFAULT) -> list[int]:
    """Positions each part of a report appends at most, in order: each section (its input and
    section_tokens), then the key figures if `summary` (the template: its holes are inside it)."""
    data = spec.data.to_payload()
    parts = []
    for s in spec.outline:
        ids, _, facts = section_input(tok, s.title, section_payload(data, list(s.metrics)), profile)
        parts.append(len(ids) + section_tokens(tok, facts, spec.params.max_new_tokens, profile))
    return parts + ([len(report_template(tok, data, 0, profile)[0])] if spec.summary else [])


def check_ids(spec: object, cfg: ModelConfig) -> None:
    """BadInput for a token id the model cannot take: the input's ids and the stop sequences'
    must lie in its vocabulary, and none may be the mask id (a hole is an infill's)."""
    ids = list(getattr(spec, "input_ids", None) or [])
    params = getattr(spec, "params", None)
    ids += [t for seq in (params.stop if params is not None else []) for t in seq]
    if not cfg.valid_ids(ids):
        raise BadInput(f"token ids must be in [0, {cfg.vocab_size}) and not the mask id {cfg.mask_id} (holes: infill)")


def check_fits(kind: str, spec: object, tok: Tokenizer, used: int, max_seq_len: int,
               profile: Profile = DEFAULT) -> int:
    """The positions the job needs (positions()); BadInput when it cannot fit: `used` positions
    of the session are taken already."""
    need = positions(kind, spec, tok, profile)
    if used + need > max_seq_len:
        raise BadInput(f"context_overflow: this {kind} needs up to {need} positions and the session has "
                       f"{max_seq_len - used} of {max_seq_len} left (fewer sections, shorter inputs or a smaller "
                       f"max_new_tokens, or a new session)")
    return need
