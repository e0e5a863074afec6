"""The `report` job kind: a section per outline item, each a turn of one session (the earlier
sections stay in its cache; each is a document of its own, model/masks.py), then the key-figures
template filled by infill in the same session; the report as Markdown and HTML.  Each section
and the key figures are read back before the report is returned (workflows/checked.py: a part
that fails is decoded again, greedy AR, where the plan leaves room for it).  Each section's
result carries its chart (a Vega-Lite spec) and drivers, computed from its data; the exports
(runtime/api/exports.py) show them as the spec's `detail` says."""

from __future__ import annotations

import html
from dataclasses import replace
from typing import Any

from domain import charts, drivers
from domain import narrative as corpus
from domain.facts import Slots
from domain.payload import Payload, Rendered
from domain.report import HOLE, Section, Template, infill_tokens, template
from model.params import DecodeParams
from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.jobs.specs import HOLE as HOLE_MARK
from runtime.jobs.specs import ReportSpec
from runtime.sessions.turn import TurnResult
from workflows.checked import Retry, check, positions
from workflows.narrative import guide, longest, problems
from workflows.turn import (
    DEFAULT,
    Turns,
    decode_params,
    facts_table,
    filled,
    fits,
    readable,
    slot_form,
    summary,
    text_of,
    with_stops,
    written_out,
)

assert HOLE == HOLE_MARK


# ---- the plan: each part's input, and what it may decode -----------------------------------------
# Each section's input ends with its heading, "## {title}\n" (the first line of the section as
# the model was trained to write it): the title is the user's, verbatim, and the model writes
# the body.


def section_payload(data: Payload, keys: list[str]) -> Payload:
    """The data one section is written from: its metrics (in outline order), and the breakdown
    when it breaks one of them down (as in training, where a section has at most two metrics)."""
    by_key = {m.key: m for m in data.metrics}
    b = data.breakdown if data.breakdown is not None and data.breakdown.metric in keys else None
    return Payload(data.tenant, data.period, data.style, [by_key[k] for k in keys], b)


def section_input(tok: Tokenizer, title: str, payload: Payload, profile: Profile = DEFAULT
                  ) -> tuple[list[int], str, Rendered]:
    """The profile's `report` format around <section>title / payload</section>, then "## title\n"
    (setflow's models: [BOS] <section>[F1] ... </section> ## [F1]\n): ids, the text as the
    model reads it, and the section's facts (Section.render: the title is the first)."""
    prompt, title_slot, r = Section(title, payload).render(facts_table(profile))
    head = readable(profile, r.slots, f"## {title_slot}\n")
    prompt = readable(profile, r.slots, prompt)
    return profile.render("report", prompt, tok) + tok.encode(head), prompt + head, r


def section_tokens(tok: Tokenizer, facts: Rendered, cap: int, profile: Profile = DEFAULT) -> int:
    """What a section may decode: the report's max_new_tokens, or less where its longest body is
    shorter (a report of six sections, one of them with 12 breakdown rows, then fits the context)."""
    return min(cap, longest(tok, corpus.narrative_form(facts), profile, facts.slots))


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


def report_parts(spec: ReportSpec, tok: Tokenizer, profile: Profile = DEFAULT) -> list[int]:
    """Positions each part of a report appends at most, in order: each section (its input and
    section_tokens), then the key figures if `summary` (the template: its holes are inside it)."""
    data = spec.data.to_payload()
    parts = []
    for s in spec.outline:
        ids, _, facts = section_input(tok, s.title, section_payload(data, list(s.metrics)), profile)
        parts.append(len(ids) + section_tokens(tok, facts, spec.params.max_new_tokens, profile))
    return parts + ([len(report_template(tok, data, 0, profile)[0])] if spec.summary else [])


def planned(spec: ReportSpec, tok: Tokenizer, profile: Profile = DEFAULT) -> int:
    """A report's plan (workflows.PLANS): its parts together."""
    return sum(report_parts(spec, tok, profile))


def run(turns: Turns, spec: ReportSpec) -> dict[str, Any]:
    """The whole plan is checked against the model's context before the first section.
    Progress after each section: {"section": sections done, "sections": n, "title": the last
    one done}."""
    # the session without this job's own turns (a rerun has written some already): the plan counts them
    used = turns.used()
    need = report_parts(spec, turns.tokenizer, turns.profile)
    fits("report", sum(need), used, turns.cfg.max_seq_len)
    # positions the plan leaves over (each part at most): a part's retry may take them, and what
    # a part takes less than its share; never what a later part may still need
    spare = turns.cfg.max_seq_len - used - sum(need)
    data = spec.data.to_payload()
    n = len(spec.outline) + int(spec.summary)
    turns.report(section=0, sections=n, title=None)
    sections: list[dict[str, Any]] = []
    session = ""
    for i, item in enumerate(spec.outline):
        done, session, took = section(turns, item.title, section_payload(data, list(item.metrics)),
                                      decode_params(spec.params), room=spare + need[i],
                                      allow_unverified=spec.allow_unverified, guided=spec.guided)
        spare += need[i] - took
        sections.append(done)
        turns.report(section=i + 1, sections=n, title=item.title)
    figs = None
    if spec.summary:
        figs = figures(turns, data, decode_params(spec.infill_params), room=spare + need[-1],
                       allow_unverified=spec.allow_unverified)
        turns.report(section=n, sections=n, title="Key figures")
    md = [f"# {spec.title}", f"*{data.tenant}, {data.period}*", *(x["markdown"] for x in sections)]
    if figs is not None:
        md += ["## Key figures", figs["markdown"]]
    markdown = "\n\n".join(md) + "\n"
    parts = sections + ([figs] if figs is not None else [])
    return {"session": session, "title": spec.title, "markdown": markdown, "html": to_html(markdown),
            "sections": sections, "figures": figs, "verified": all(x["verified"] for x in parts),
            "attempt": "ar_retry" if any(x["attempt"] == "ar_retry" for x in parts) else "first",
            "detail": spec.detail, "audience": spec.audience}


def section(turns: Turns, title: str, payload: Payload, params: DecodeParams, *, room: int | None = None,
            allow_unverified: bool = False, guided: bool = True) -> tuple[dict[str, Any], str, int]:
    """One section as a turn: its input ends with the heading, the model writes the body; the
    facts read back out of it (checked).  room: positions the section may take, its retry
    included (None: what the model's context has left).  Returns the section's result, the
    session's id and the positions it took.  guided: its decoding held to the narrative's forms
    (workflows/narrative.py FormGuide)."""
    profile = turns.profile
    ids, text_in, facts = section_input(turns.tokenizer, title, payload, profile)
    params = with_stops(turns, replace(params, max_new_tokens=section_tokens(turns.tokenizer, facts, params.max_new_tokens,
                                                                             profile)))
    params = guide(turns, params, corpus.narrative_form(facts), guided)

    def read(r: TurnResult) -> tuple[tuple[str, corpus.Check], list[str]]:
        written = text_of(turns, r.tokens).strip()
        c = corpus.read_back(facts, slot_form(profile, facts.slots, written))  # every sentence, every slot
        return (f"## {title}\n" + written_out(profile, facts.slots, written), c), problems(c)

    first = turns.turn(ids, params, text=text_in, facts=facts.slots)
    took = positions(ids, first)
    done = check(turns, "section", first, read, Retry(ids, params, text_in, room=None if room is None else room - took,
                                                      facts=facts.slots),
                 allow_unverified=allow_unverified, label=title)
    took += positions(ids, done.turn) if done.attempt == "ar_retry" else 0
    text, c = done.value
    return ({"title": title, "markdown": text, "facts_ok": c.facts_ok, "facts_total": c.facts_total,
             **summary(done.turn), **done.fields(), "chart": charts.chart(payload, title),
             "drivers": drivers.drivers(payload)}, done.turn.session, took)


def figures(turns: Turns, data: Payload, params: DecodeParams, *, room: int | None = None,
            allow_unverified: bool = False) -> dict[str, Any]:
    """The key-figures template of `data` (its breakdown left out) filled by infill; exact: every
    hole holds the answer the data fixes (checked).  room: as for a section."""
    tok, mask = turns.tokenizer, turns.cfg.mask_id
    masked, answers, text_in, slots = report_template(tok, data, mask, turns.profile)
    holes = _runs([t == mask for t in masked])  # each hole's [a, b): one number or word

    def read(r: TurnResult) -> tuple[list[int], list[str]]:
        got = filled(masked, r, mask)
        return got, [f"{tok.decode(got[a:b])!r} where the data has {tok.decode(answers[a:b])!r}"
                     for a, b in holes if got[a:b] != answers[a:b]]

    first = turns.turn(masked, params, text=text_in, infill=True, facts=slots)
    room_left = None if room is None else room - positions(masked, first, infill=True)
    done = check(turns, "figures", first, read, Retry(masked, params, text_in, infill=True, room=room_left, facts=slots),
                 allow_unverified=allow_unverified)
    body = written_out(turns.profile, slots, tok.decode(done.value, skip_special=True).split("fill: ", 1)[-1].strip())
    return {"markdown": body, "exact": done.value == answers, **summary(done.turn), **done.fields()}


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """[a, b) of each run of True in flags."""
    out: list[tuple[int, int]] = []
    for i, f in enumerate(flags):
        if f and (i == 0 or not flags[i - 1]):
            out.append((i, i + 1))
        elif f:
            out[-1] = (out[-1][0], i + 1)
    return out


def to_html(markdown: str) -> str:
    """The report's Markdown as a standalone HTML page (headings, emphasis lines, paragraphs:
    all the report's Markdown uses); every text escaped."""
    body = []
    for block in markdown.strip().split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("## "):
                body.append(f"<h2>{html.escape(line[3:])}</h2>")
            elif line.startswith("# "):
                body.append(f"<h1>{html.escape(line[2:])}</h1>")
            elif line.startswith("*") and line.endswith("*") and len(line) > 2:
                body.append(f"<p><em>{html.escape(line[1:-1])}</em></p>")
            elif line.strip():
                body.append(f"<p>{html.escape(line)}</p>")
    title = markdown.split("\n", 1)[0].removeprefix("# ")
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title></head>\n"
            f"<body>\n{chr(10).join(body)}\n</body></html>\n")
