"""Guided calls: what a call may still become as the model writes it, so that a guide keeps its
copies right (a name the question or the store holds, a number of the question or of the results
so far).  answers.verify() holds the finished calls to the question; this only says whether a
call's text so far can still become one training writes."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from domain.facts import SLOT
from domain.tools import DIGITS, END_CALL, NUMBER, SAMPLE_NAMES, holds

_METRIC, _CALC = 'metric("', 'calc("'  # a call's text up to its first argument
_EXPR_CHARS = frozenset("0123456789.+-*/() ")


@dataclass(frozen=True)
class CallNames:
    """What a call may copy.  A metric call's arguments: a name the question holds whole (as in
    training), or one the source is known to hold, per field (the sample dataset's fixed lists;
    () for a tenant's table, whose rows may change during a job: the guide would too).  A calc
    expression's numbers: those of the question and of the results so far (after), and 100 (a
    percentage), as training writes them.  A guide keeps copies right; answers.verify() holds the
    calls to the question (a period's digits, or a 100 outside a percent change, copyable here,
    are no operand there)."""

    question: str
    held: tuple[tuple[str, ...], ...] = ((), (), ())  # per field (metric, region, period), sorted
    numbers: frozenset[str] = frozenset()  # set by after()
    slots: frozenset[str] = frozenset()  # results that are slots (domain/agent_facts.py), set by after()

    @classmethod
    def sample(cls, question: str) -> CallNames:
        return cls(question, tuple(tuple(sorted(x)) for x in SAMPLE_NAMES))

    def after(self, results: Iterable[str]) -> CallNames:
        """These names, the numbers of the question and of `results` (the calls' so far) copyable;
        a result that is a slot as that slot, never its digits."""
        results = list(results)
        slots = {r for r in results if SLOT.fullmatch(r)}
        nums = {"100", *NUMBER.findall(SLOT.sub(" ", self.question)),
                *(n for r in results if r not in slots for n in NUMBER.findall(r))}
        return replace(self, numbers=frozenset(nums), slots=frozenset(slots))

    def starts(self, field: int, a: str) -> bool:
        """a may still grow into a name: it starts a word of the question, or a held name."""
        if not a or holds(self.question, a, whole=False):
            return True
        names = self.held[field]
        i = bisect.bisect_left(names, a)
        return i < len(names) and names[i].startswith(a)

    def names(self, field: int, a: str) -> bool:
        return bool(a) and (holds(self.question, a) or a in self.held[field])


def guided_call(call: str, names: CallNames) -> bool | None:
    """call: the text after `<call>` so far.  None: not inside a call's arguments (the tool's
    name still being written), so not guided.  Else whether it can still become a call training
    writes, then `</call>`: metric("m", "r", "p"), each argument a name `names` allows
    ('metric("Xfe' -> True where the question holds "Xfers 32"; 'metric("Xfg' -> False), or
    calc("expr"), each of its numbers one `names` allows ('calc("(6323.7-9' -> False where the
    results are 939823.2 and 6323.7); calc with no numbers known (no after()) is not guided."""
    if call.startswith(_METRIC):
        return _metric_call(call[len(_METRIC):], names)
    if call.startswith(_CALC) and names.numbers:
        return _calc_call(call[len(_CALC):], names)
    return None


def _metric_call(text: str, names: CallNames) -> bool:
    parts = text.split('"')  # names hold no '"': argument, separator, argument, ...
    if len(parts) > 6:
        return False
    for k, part in enumerate(parts):
        last = k == len(parts) - 1
        if k % 2 == 0:  # argument k // 2
            ok = names.starts(k // 2, part) if last else names.names(k // 2, part)
        else:  # what follows its closing '"': the separator's rest, or the call's end
            rest = ", " if k < 5 else ")" + END_CALL
            ok = rest.startswith(part) if last else part == rest
        if not ok:
            return False
    return True


def _calc_call(text: str, names: CallNames) -> bool:
    expr, quote, tail = text.partition('"')
    if quote and not (")" + END_CALL).startswith(tail):
        return False
    if any(m.group() not in names.slots for m in SLOT.finditer(expr)):  # a slot: a result's
        return False
    bare = SLOT.sub(" ", expr)
    part = _PART_SLOT.search(bare)  # a slot's text still being written ("[F1" of "[F12]")
    if part is not None:
        if quote or not any(s.startswith(part.group()) for s in names.slots):
            return False
        bare = bare[:part.start()]
    if not set(bare) <= _EXPR_CHARS:
        return False
    runs = list(DIGITS.finditer(bare))
    for k, m in enumerate(runs):
        open_ = not quote and part is None and k == len(runs) - 1 and m.end() == len(bare)  # still being written
        if not (any(n.startswith(m.group()) for n in names.numbers) if open_ else m.group() in names.numbers):
            return False
    return True


_PART_SLOT = re.compile(r"\[(?:F[0-9]*)?$")
