"""Report sections: an outline line with its data -> section text; and report templates whose
holes are filled by infill.  Deterministic by seed.  Facts are slots (domain/facts.py): the
section's title is its first, then its payload's (payload.Payload.render).

Section (prompt, then target):

    <section>[F1]
    tenant: [F2] | period: [F3] | style: formal
    [F4]: down [F5], [F6] [F7], prev [F8], above target [F9]
    </section>
    ## [F1]
    [F4] fell [F5] to [F6] [F7], compared with [F8] in the prior period, above its target of [F9].

Template (one line per metric, after the payload); the holes are the value and prev slots and
the trend and target words, marked `<hole>` once per token in the text a user writes:

    [F4]: <hole> [F7] (<hole>; previous <hole>; target [F9], <hole>).

Infill fills each hole in place: positions never shift, so the number of tokens per hole is part
of the template (as in the reference's infill evaluation, where the span length is given).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Protocol

from domain import draws
from domain import narrative as nar
from domain.facts import Slots
from domain.payload import Payload, Rendered


class Tokenizer(Protocol):
    """What infill_tokens needs of a tokenizer (model/tokenizer.py's)."""

    @property
    def bos_id(self) -> int: ...
    @property
    def eos_id(self) -> int: ...
    def encode(self, text: str) -> list[int]: ...

SECTION, END_SECTION, HOLE = "<section>", "</section>", "<hole>"
TITLES = {
    "revenue": ("Revenue", "Sales performance", "Top line"),
    "orders": ("Order volume", "Sales performance"),
    "conversion": ("Funnel", "Conversion"),
    "churn": ("Customer health", "Retention"),
    "aov": ("Basket size", "Pricing"),
    "latency": ("Platform performance", "Reliability"),
    "active_users": ("Engagement", "Usage"),
    "tickets": ("Support", "Customer service"),
    "margin": ("Profitability", "Margins"),
    "signups": ("Growth", "Acquisition"),
}


# ---- sections -----------------------------------------------------------------------------


@dataclass
class Section:
    title: str
    payload: Payload

    def render(self, slots: Slots | None = None) -> tuple[str, str, Rendered]:
        """(the prompt in slot form, the title's slot, the payload's rendering): the title is the
        first fact of its table, then the payload's (Payload.render)."""
        slots = Slots() if slots is None else slots
        title = slots.add(self.title)
        r = self.payload.render(slots)
        return f"{SECTION}{title}\n{r.prompt}{END_SECTION}\n", title, r

    def prompt_text(self, slots: Slots | None = None) -> str:
        return self.render(slots)[0]


def make_section(rng: random.Random, wild: bool = False) -> Section:
    """wild: its data drawn from the API's grammar (draws.wild_payload), its title too."""
    p = draws.wild_payload(rng) if wild else draws.make_payload(rng)
    p.metrics = p.metrics[:2]
    if p.breakdown is not None and p.breakdown.metric not in [m.key for m in p.metrics]:
        p.breakdown.metric = p.metrics[0].key
    first = p.metrics[0]
    title = rng.choice(TITLES[first.key]) if not first.custom and (not wild or rng.random() < 0.5) else \
        draws.wild_name(rng)
    return Section(title, p)


def section_text(rng: random.Random, s: Section, slots: Slots | None = None) -> str:
    """The section as the model writes it, in slot form: its heading, then its narrative."""
    _, title, r = s.render(slots)
    return f"## {title}\n{nar.write(rng, nar.narrative_form(r))}"


def section_example(rng: random.Random, wild: bool = False) -> tuple[Section, str]:
    s = make_section(rng, wild)
    return s, section_text(rng, s)


def check_section(s: Section, text: str) -> nar.Check:
    """A section in slot form read back: its heading, then its body as a narrative is."""
    _, title, r = s.render()
    head, _, body = text.partition("\n")
    c = nar.read_back(r, body)
    if head != f"## {title}":
        c.problems.append(f"heading {r.slots.lexicalise(head)!r} != {'## ' + s.title!r}")
    return c


# ---- templates filled by infill ---------------------------------------------------------------

TREND = {"up": "up", "down": "down", "flat": "flat"}


@dataclass
class Template:
    rendered: Rendered  # the payload in slot form (its breakdown left out)
    pieces: list[tuple[str, bool]]  # (text in slot form, is_hole), in order; hole texts are the answers
    context: str | None = None  # what precedes the template (None: the payload in slot form, "fill: ")

    def context_text(self) -> str:
        return self.context if self.context is not None else self.rendered.prompt + "fill: "

    def text(self, hole: str | None = None) -> str:
        """The filled text, or with each hole's text replaced by `hole` (e.g. a marker)."""
        return "".join(t if not h or hole is None else hole for t, h in self.pieces)

    @property
    def answers(self) -> list[str]:
        return [t for t, h in self.pieces if h]


def make_template(rng: random.Random) -> Template:
    p = draws.make_payload(rng)
    p.breakdown = None
    return template(p)


def template(p: Payload, slots: Slots | None = None) -> Template:
    """The key-figures template of a payload's metrics: a line per metric whose facts (slots the
    runtime places) frame the holes the model fills, the trend and target words (the breakdown,
    if any, is not part of it)."""
    r = replace(p, breakdown=None).render(slots)
    pieces: list[tuple[str, bool]] = []
    for i, c in enumerate(r.metrics):
        pieces += [(f"{'' if i == 0 else ' '}{c.name}: ", False), (c.value, False), (f" {c.unit} (", False),
                   (TREND[c.direction], True), ("; previous ", False), (c.prev, False)]
        if c.target is not None:
            assert c.comparison is not None
            pieces += [(f"; target {c.target}, ", False), (c.comparison, True)]
        pieces.append((").", False))
    return Template(r, pieces)


def infill_tokens(tok: Tokenizer, t: Template) -> tuple[list[int], list[bool]]:
    """[BOS] context template [EOS] and which tokens are holes.  Pieces are encoded one by
    one, so a hole is a whole number of tokens (the same split in training and at inference)."""
    ids = [tok.bos_id, *tok.encode(t.context_text())]
    hole = [False] * len(ids)
    for text, is_hole in t.pieces:
        piece = tok.encode(text)
        ids += piece
        hole += [is_hole] * len(piece)
    return ids + [tok.eos_id], hole + [False]
