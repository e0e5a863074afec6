"""Checked output: a part of a job's result (a narrative, a report section, the key figures, an
agent's answer) is read back by its checker before the job may succeed.  A part that fails is
decoded once more with the safest policy (greedy AR, the part's own limits and stops); if that
fails too, the job fails with Unverified ("unverified", the problems in its error), unless its
spec allows it back flagged (`verified: false`).  Which checker, and what a part's input is, the
workflows say; who runs the turns (a job's session, one in this process) is not known here.

The retry is one more turn of the same session, whose input starts a document of its own
(model/masks.py within_documents: no query sees a key before the last document start it sees),
so the failed attempt stays in the cache but the retry cannot attend to it.  A job rerun after a
crash replays both turns as they were written (runtime/jobs/context.py: by job step), and reads
them back to the same verdict: the outcome is the same on every run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from domain.facts import Slots
from model.params import DecodeError, DecodeParams
from runtime.errors import BadInput, Unverified
from runtime.sessions.turn import TurnResult
from workflows.turn import Turns, summary

T = TypeVar("T")

#: a part's checker: the turn that wrote it -> (what the part is, read from it; the problems, [] = verified)
Read = Callable[[TurnResult], tuple[T, list[str]]]


@dataclass
class Retry:
    """How a part is decoded again: its input, a document of its own (starting with the model's
    document start), decoded as a plain or an infill turn with the AR version of `params`."""

    ids: list[int]
    params: DecodeParams
    text: str = ""  # the input as rendered, for the session's record
    infill: bool = False
    room: int | None = None  # positions it may take (None: what the model's context has left)
    facts: Slots | None = None  # the input's slot table (Turns.turn)


@dataclass
class Checked(Generic[T]):
    value: T  # the part as its checker read it, from `turn`
    turn: TurnResult  # the turn that wrote the part returned (the retry's, after one)
    attempt: str  # "first" or "ar_retry": which decode wrote it
    problems: list[str]  # what the checker found wrong in it; [] = verified
    first: TurnResult  # the first decode (`turn` itself, without a retry)
    first_problems: list[str]  # what was wrong with the first, when it was decoded again

    @property
    def verified(self) -> bool:
        return not self.problems

    def fields(self) -> dict[str, Any]:
        """What a result says of the check; after a retry, also why, and the first decode's turn."""
        out: dict[str, Any] = {"verified": self.verified, "attempt": self.attempt, "problems": self.problems}
        if self.attempt == "ar_retry":
            out["retried"] = {"problems": self.first_problems, **summary(self.first)}
        return out


def ar(params: DecodeParams) -> DecodeParams:
    """The safest policy: greedy AR (W = 1, no threshold, temperature 0), the same limits and stops."""
    return replace(params, policy="ar", window=1, tau=None, temperature=0.0)


def positions(ids: list[int], r: TurnResult, infill: bool = False) -> int:
    """Positions a turn took in its session: its input, and what it decoded after it (an
    infill's holes lie inside its input)."""
    return len(ids) + (0 if infill else len(r.tokens))


def check(turns: Turns, part: str, first: TurnResult, read: Read[T], retry: Retry, *,
          allow_unverified: bool, label: str = "") -> Checked[T]:
    """Read `first` back; on problems decode `retry` once (greedy AR) and read that back.
    Unverified when it still fails, unless allow_unverified (then returned with its problems).
    part: what the metrics count it as ("narrative", "section", "figures", "answer"); label:
    which one, for the error.  No retry (its reason added to the problems) when it would
    decode what the first did (first decoded greedy AR already: `params` is its own AR
    version), when it could see the failed attempt (its input does not start a document), or
    when it does not fit (retry.room, or the model's context)."""
    value, problems = read(first)
    r, attempt, first_problems = first, "first", problems
    if problems:
        why_not = _no_retry(turns, retry)
        if why_not is None:
            try:
                r = turns.turn(retry.ids, ar(retry.params), text=retry.text, infill=retry.infill, facts=retry.facts)
            except DecodeError as e:  # refused before anything changed
                if e.code != "context_overflow":
                    raise
                why_not = f"the session has no room for it ({e})"
            except BadInput as e:  # the first's input was taken: an agent's whole document may be too long
                why_not = f"its input was refused ({e})"
        if why_not is None:
            attempt = "ar_retry"
            value, problems = read(r)
        else:
            problems = [*problems, f"not decoded again with greedy AR: {why_not}"]
    outcome = attempt if not problems else ("flagged" if allow_unverified else "unverified")
    if r.path != "done":  # a turn a rerun replays was counted when it was decoded
        turns.checked(part, outcome)
    if problems and not allow_unverified:
        where = f"{part} {label!r}" if label else part
        after = " after the greedy AR retry" if attempt == "ar_retry" else ""
        raise Unverified(f"the {where} failed its check{after}: {'; '.join(problems)}", problems)
    return Checked(value, r, attempt, problems, first, first_problems)


def _no_retry(turns: Turns, retry: Retry) -> str | None:
    """Why `retry` is not decoded, or None when it is."""
    if ar(retry.params) == retry.params:
        return "it decoded with greedy AR already (the same policy would write the same tokens)"
    start = turns.cfg.doc_start_id
    if start is None or not retry.ids or retry.ids[0] != start:
        return "this model has no document boundaries here, so the retry would see the failed attempt"
    need = len(retry.ids) + (0 if retry.infill else retry.params.max_new_tokens)
    if retry.room is not None and need > retry.room:
        return f"it needs up to {need} positions and the job's later parts leave it {retry.room}"
    return None
