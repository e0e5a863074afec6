"""Dashboard narratives: a metrics payload (domain/payload.py) -> a narrative paragraph, and the
checker that reads a text back against its payload.  Deterministic by seed.

The model never copies a fact: every name, unit, period and number of the payload enters its
input as a slot token (domain/facts.py), and it writes slot tokens where a fact goes; the runtime
writes the facts.  The payload as the model reads it (Payload.render):

    tenant: [F1] | period: [F2] | style: brief
    [F3]: up [F4], [F5] [F6], prev [F7], below target [F8]
    [F9]: flat, [F10] [F11], prev [F12]
    by region ([F3]): [F13] up [F14] prev [F15]; [F16] down [F17] prev [F18]

and the narrative it writes mentions every metric and every breakdown row once, in payload
order: "[F3] rose [F4] to [F5] [F6] from [F7], below the [F8] target. ..." ("Revenue rose 12.2%
to 1240 k USD from 1105, below the 1300 target.").  What a number implies is computed here,
exactly, and given: the trend against prev, the standing against the target, the percent change
(none from a prev of 0 or below); the model phrases it.  Each payload line gives its facts in
the order a clause says them, so writing a clause is copying the next slot of its line.

The narrative's forms (narrative_form: its lead, a clause per metric, the breakdown's sentence,
each a sequence of choices) are the one source of both the training texts and the checker: a
text is fully correct only when it is one of them for its payload (read_back), and the reading
of each clause says what is wrong.  A payload's names may be any text (the API's grammar,
domain/grammar.py): no name is ever tokenized for setflow's own models.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache

from domain.draws import make_payload, wild_payload
from domain.drivers import rendered
from domain.facts import SLOT, Slots, slots_in
from domain.markup import MARKUP_TOKENS, SPECIAL_TOKENS
from domain.payload import Clause, Payload, Rendered

# direction and comparison vocabularies: the checker classifies a clause by these words, so none
# of them may appear elsewhere in a template
UP = ("rose", "increased", "climbed", "grew")
DOWN = ("fell", "decreased", "dropped", "declined")
FLAT = ("held flat", "was unchanged", "stayed level")
ABOVE = ("above", "ahead of")
BELOW = ("below", "short of")
ON = ("right on", "exactly at")
DIRECTIONS: dict[str, tuple[str, ...]] = {"up": UP, "down": DOWN, "flat": FLAT}
COMPARISONS: dict[str, tuple[str, ...]] = {"above": ABOVE, "below": BELOW, "on": ON}


# ---- the narrative's forms: one source for writing a narrative and for reading one back ----------

#: a text as a sequence of choices: one alternative of each, in order (a literal is a choice of one)
Form = list[tuple[str, ...]]


def _target_forms(c: Clause, style: str) -> tuple[str, ...]:
    if c.target is None or c.comparison is None:
        return ("",)
    words = COMPARISONS[c.comparison]
    if style == "casual":
        return tuple(f", {w} the goal of {c.target}" for w in words)
    return tuple(f", {w} the {c.target} target" for w in words) + tuple(f", {w} its target of {c.target}" for w in words)


def metric_form(c: Clause, style: str, first: bool) -> Form:
    to = "at" if c.direction == "flat" else "to"
    unit = f" {c.unit}" if c.unit else ""
    dirs, tgt = DIRECTIONS[c.direction], _target_forms(c, style)
    if style == "brief":
        return [(f"{c.name} ",), dirs, (f"{' ' + c.change if c.change else ''} {to} {c.value}{unit} from {c.prev}",), tgt,
                (".",)]
    if style == "formal":
        return [(f"{c.name} ",), dirs, (f"{' ' + c.change if c.change else ''} {to} {c.value}{unit}, compared with "
                                        f"{c.prev} in the prior period",), tgt, (".",)]
    lead = ("",) if first else ("", "Meanwhile, ", "Also, ")
    return [lead, (f"{c.name} ",), dirs, (f"{' by ' + c.change if c.change else ''}: {c.value}{unit} now vs {c.prev} "
                                          "before",), tgt, (".",)]


def breakdown_form(r: Rendered) -> Form:
    form: Form = [(f"Broken down by {r.kind}: " if r.style == "formal" else f"By {r.kind}, ",)]
    for i, c in enumerate(r.rows):
        if i:
            form.append((" and " if i == len(r.rows) - 1 else ", ",))
        form += [(f"{c.name} ",), DIRECTIONS[c.direction], (f" {'at' if c.direction == 'flat' else 'to'} {c.value} from "
                                                             f"{c.prev}",)]
    return form + [(".",)]


def _listed(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def largest_sentences(r: Rendered, covers: bool) -> tuple[str, ...]:
    """The sentences that name the row that added most to the change: of the whole change where
    the rows cover it (Drivers.covers), else of the rows shown ("the largest part of the change"
    of a partial breakdown would be a claim about rows it does not send)."""
    d = r.drivers
    assert d is not None, "no drivers to say"
    if covers:
        return (f"{d.largest} added the most to the change ({d.share}).",
                f"The largest part of the change came from {d.largest} ({d.share}).",
                f"{d.largest} made up {d.share} of the change, the most of any {r.kind}.")
    return (f"Of the {r.kind}s shown, {d.largest} added the most to the change ({d.share}).",
            f"Of the {r.kind}s shown, the largest share of the change came from {d.largest} ({d.share}).",
            f"Of the {r.kind}s shown, {d.largest} made up {d.share} of the change, the most of any.")


def drivers_form(r: Rendered) -> Form:
    """The breakdown's drivers (a narrative at detail `full`): the row that added most to the
    change, with its share of it (largest_sentences); then the rows that moved against it, if any."""
    d = r.drivers
    if d is None:
        return []
    form: Form = [(" ",), largest_sentences(r, d.covers)]
    if d.against:
        form += [(" ",), (_listed(d.against),), (" moved against the trend.", " went the other way.")]
    return form


def leads(r: Rendered) -> tuple[str, ...]:
    """The sentences a narrative may open with, by style."""
    return {"brief": ("",),
            "formal": (f"In {r.period}, {r.tenant} reported the following. ", f"This is the {r.period} summary for {r.tenant}. "),
            "casual": (f"Here is how {r.period} went for {r.tenant}. ", f"Quick look at {r.period}. ")}[r.style]


def narrative_form(r: Rendered) -> Form:
    """Every narrative of a payload: its lead, a clause per metric, the breakdown's sentence,
    its drivers' (where the rendering has them)."""
    form: Form = [leads(r)]
    for i, c in enumerate(r.metrics):
        form += ([(" ",)] if i else []) + metric_form(c, r.style, i == 0)
    if r.rows:
        form += [(" ",), *breakdown_form(r)]
    return form + drivers_form(r)


def write(rng: random.Random, form: Form) -> str:
    """One text of `form`; rng picks among each choice's alternatives."""
    return "".join(alts[0] if len(alts) == 1 else rng.choice(alts) for alts in form)


def pattern(form: Form) -> re.Pattern[str]:
    """What every text of `form` matches, and nothing else."""
    return re.compile("".join("(?:" + "|".join(map(re.escape, alts)) + ")" for alts in form))


def begins(form: Form, text: str) -> bool:
    """Whether `text` begins some text of `form` (a guide's question while the model writes:
    may it still become one?).  Each choice's alternatives are literals, so a text is followed
    choice by choice; a search with one memo entry per (choice, offset)."""

    @cache
    def at(i: int, k: int) -> bool:  # text[k:] begins a text of form[i:]
        rest = text[k:]
        if not rest:
            return True
        if i == len(form):
            return False
        return any(at(i + 1, k + len(a)) if rest.startswith(a) else a.startswith(rest) for a in form[i])

    return at(0, 0)


def narrative(rng: random.Random, p: Payload, slots: Slots | None = None, drivers: bool = False) -> str:
    """One narrative for payload p, in slot form (Slots.lexicalise writes its facts); rng picks
    the phrasing."""
    return write(rng, narrative_form(rendered(p, slots, drivers)))


def example(rng: random.Random) -> tuple[Payload, str]:
    p = make_payload(rng)
    return p, narrative(rng, p)


def wild_example(rng: random.Random) -> tuple[Payload, str]:
    p = wild_payload(rng)
    return p, narrative(rng, p)


def prompt_text(p: Payload) -> str:
    """The prompt the model sees: the payload in slot form, then the narrative marker."""
    return prompt_of(p.render())


def prompt_of(r: Rendered) -> str:
    return r.prompt + "narrative: "


# ---- checking -----------------------------------------------------------------------------

_DIGIT = re.compile(r"\d")
_MARKUP = (*SPECIAL_TOKENS, *MARKUP_TOKENS, "<", ">")


@dataclass
class Check:
    facts_ok: int
    facts_total: int
    problems: list[str] = field(default_factory=list)

    @property
    def fully_correct(self) -> bool:
        return not self.problems and self.facts_ok == self.facts_total


def _classify(text: str, vocab: Mapping[str, tuple[str, ...]]) -> list[str]:
    return [cls for cls, words in vocab.items() for w in words if re.search(rf"\b{w}\b", text)]


def check(p: Payload, text: str, drivers: bool = False) -> Check:
    """A narrative in slot form read back against its payload (read_back)."""
    return read_back(rendered(p, said=drivers), text)


def read_back(r: Rendered, text: str) -> Check:
    """Read a narrative in slot form back against its payload's rendering.  Fully correct only when the whole
    text is one the narrative's forms write for this payload (its lead, each clause with its own
    slots in their places, its trend and target words, nothing else): a slot that names another
    fact, a missing or doubled fact, a stray number, a word or mark the forms never write, a
    garbled lead all fail.  The reading of each clause (its slots, trend and target words) says
    what is wrong and counts the facts that are right."""
    total = r.facts
    if pattern(narrative_form(r)).fullmatch(text):
        return Check(total, total)
    ok, problems = _read(r, text)
    return Check(ok, total, problems or [f"the text is not one the narrative's forms write: {text!r}"])


def _read(r: Rendered, text: str) -> tuple[int, list[str]]:
    """(facts right, problems) of a text that is not one of its forms."""
    lex = r.slots.lexicalise
    problems = [f"markup in the text: {m!r}" for m in _MARKUP if m in text]
    known = set(r.slots.tokens())
    problems += [f"slot {s} names no fact" for s in dict.fromkeys(slots_in(text)) if s not in known]
    if _DIGIT.search(SLOT.sub("", text)):
        problems.append(f"a number the payload does not give: {SLOT.sub('', text)!r}")
    found: list[tuple[int, int, Clause]] = []  # (start, end of the name, clause)
    cursor = 0
    for c in r.clauses:
        at = text.find(c.name, cursor)
        if at < 0:
            problems.append(f"{lex(c.name)!r} not mentioned")
            continue
        found.append((at, at + len(c.name), c))
        cursor = at + len(c.name)
    head = text[: found[0][0]] if found else text
    if r.metrics and found and found[0][2] is r.metrics[0] and head not in leads(r):
        problems.append(f"the opening {lex(head)!r} is not one of the {r.style} style's")
    ok, tail = 0, ""
    for j, (_, e_name, c) in enumerate(found):
        clause = text[e_name: found[j + 1][0] if j + 1 < len(found) else len(text)]
        if j + 1 == len(found) and r.drivers is not None:  # the breakdown's sentence ends at its "."
            clause, dot, tail = clause.partition(".")
            clause += dot
        got = slots_in(clause)
        if got != c.numbers:
            problems.append(f"{lex(c.name)}: slots {_said(got, lex)} where {_said(c.numbers, lex)} go")
        dirs, cmps = _classify(clause, DIRECTIONS), _classify(clause, COMPARISONS)
        if dirs != [c.direction]:
            problems.append(f"{lex(c.name)}: direction {dirs} != {c.direction}")
        want_c = [c.comparison] if c.comparison else []
        if cmps != want_c:
            problems.append(f"{lex(c.name)}: comparison {cmps} != {want_c}")
        ok += _common(got, c.numbers) + (dirs == [c.direction]) + (cmps == want_c and c.comparison is not None)
    if r.drivers is not None:  # what follows the breakdown's sentence: the drivers', in order
        got, want = slots_in(tail), r.drivers.numbers
        if got != want:
            problems.append(f"drivers: slots {_said(got, lex)} where {_said(want, lex)} go")
        if not r.drivers.covers and any(s in tail for s in largest_sentences(r, True)):
            problems.append("drivers: a share of the whole change claimed, and the rows sent do not cover the change")
        ok += _common(got, want)
    return ok, list(dict.fromkeys(problems))


def _common(got: list[str], want: list[str]) -> int:
    """The facts of `want` that `got` says in their places: the longest common subsequence (a
    swapped pair loses one of its two, a left-out fact only itself)."""
    row = [0] * (len(want) + 1)
    for g in got:
        prev_diag = 0
        for j, w in enumerate(want):
            prev_diag, row[j + 1] = row[j + 1], prev_diag + 1 if g == w else max(row[j + 1], row[j])
    return row[-1]


def _said(slots: list[str], lex: Callable[[str], str]) -> str:
    return "[" + ", ".join(f"{s}={lex(s)!r}" for s in slots) + "]"
