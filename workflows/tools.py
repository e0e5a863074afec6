"""The agent's tools: a calculator and a metric lookup over a sample dataset or the tenant's own
(a Table), run here (server side), or by the job's client (an agent's `client_tools`: `client_call` says what the client is
asked, the output it sends back is the result).

A call is the text the model wrote between `<call>` and `</call>`, e.g.
`metric("churn", "EMEA", "2026-Q3")` or `calc("(3.1-2.5)/2.5*100")`.  Its arguments are checked
by a pydantic model per tool; whatever goes wrong (a call that does not parse, a bad argument, an
unknown metric, a division by zero) comes back as the result text `error: ...`, which the model
reads like any other result: a tool never raises into the agent loop.

The tools' semantics (number formatting, the dataset's values) are domain.agent's, the
ones the model was trained on, so a result here reads exactly as in training.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from domain.answers import UNITS, State, answer_forms, text_arguments, unit_problems
from domain.grammar import canonical
from domain.guide import CallNames, guided_call
from domain.tools import CALL, END_CALL, MAX_EXPR, ToolError, calc, error_result, held_names, no_row, parse_call
from model.params import Guide
from model.profiles import Profile
from model.tokenizer import Tokenizer


class CalcArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    expr: str = Field(min_length=1, max_length=MAX_EXPR)


class MetricArgs(BaseModel):
    """Any names: the source says which it holds (the sample dataset its known ones, a tenant's
    table its rows')."""

    model_config = ConfigDict(extra="forbid")
    metric: str = Field(min_length=1, max_length=64)
    region: str = Field(min_length=1, max_length=64)
    period: str = Field(min_length=1, max_length=64)


class Source(Protocol):
    """What the metric tool reads: the sample dataset (domain.tools.Dataset) or a Table."""

    def lookup(self, key: str, region: str, period: str) -> str: ...


AMBIGUOUS = ""  # a Table's value for a key two stored rows share (no value is empty: datasets.check)


@dataclass(frozen=True)
class Table:
    """A tenant's own dataset (runtime/jobs/datasets.py): (metric, region, period) -> value."""

    name: str
    values: dict[tuple[str, str, str], str]
    question: str = ""  # the agent's, which the model copies names from: the hint of a miscopy's error

    @classmethod
    def of(cls, name: str, rows: list[list[str]], question: str = "") -> Table:
        """Its names as the runtime holds them (corpus canonical: runtime/jobs/datasets.py stores
        them so; a row stored before that is read so, and two such rows that are then one key
        answer neither: AMBIGUOUS)."""
        values: dict[tuple[str, str, str], str] = {}
        for m, r, p, v in rows:
            key = (canonical(m), canonical(r), canonical(p))
            values[key] = AMBIGUOUS if key in values else v
        return cls(name, values, question)

    def lookup(self, key: str, region: str, period: str) -> str:
        k = (canonical(key), canonical(region), canonical(period))
        if self.values.get(k) == AMBIGUOUS:
            raise ToolError(f"metric {k[0]!r}, region {k[1]!r}, period {k[2]!r} names two rows of dataset "
                                   f"{self.name!r} that differ only in spaces: upload it again")
        try:
            return self.values[k]
        except KeyError:  # as the model was trained to read it: the names it holds nowhere, with hints
            raise no_row(k, held_names(self.values), self.question) from None


@dataclass(frozen=True)
class Tool:
    args: type[BaseModel]
    run: Callable[[BaseModel, Source], str]


def _calc(a: BaseModel, _data: Source) -> str:
    assert isinstance(a, CalcArgs)
    return calc(a.expr)


def _metric(a: BaseModel, data: Source) -> str:
    assert isinstance(a, MetricArgs)
    return data.lookup(a.metric, a.region, a.period)


#: tool name -> its argument model (fields in call order) and its function
TOOLS: dict[str, Tool] = {"calc": Tool(CalcArgs, _calc), "metric": Tool(MetricArgs, _metric)}


@dataclass
class ToolResult:
    call: str  # the call's text as the model wrote it
    tool: str | None  # the tool it named, if it parsed
    result: str  # what goes back to the model: the value, or "error: ..."
    ok: bool


def run_call(call: str, data: Source) -> ToolResult:
    """Run one call; never raises (errors are results)."""
    try:
        name, args = parse_call(call)
    except ToolError as e:
        return ToolResult(call, None, error_result(str(e)), False)
    tool = TOOLS[name]
    try:
        parsed = tool.args.model_validate(dict(zip(tool.args.model_fields, args, strict=True)))
    except (ValidationError, ValueError) as e:
        reasons = "; ".join(err["msg"] for err in e.errors()) if isinstance(e, ValidationError) else str(e)
        return ToolResult(call, name, error_result(f"bad arguments to {name}: {reasons}"), False)
    try:
        return ToolResult(call, name, tool.run(parsed, data), True)
    except ToolError as e:
        return ToolResult(call, name, error_result(str(e)), False)


def client_call(call: str, call_id: str) -> dict[str, str | dict[str, str]] | ToolResult:
    """A call the client runs, as the client is asked it: {"id", "tool", "arguments" (by the
    tool's field names, as the model wrote them; a metric's names canonical, as the question the
    model copies them from is: the client matches its data's names so), "call"}; a call that
    does not parse is answered here as any other (the error result)."""
    try:
        name, args = parse_call(call)
    except ToolError as e:
        return ToolResult(call, None, error_result(str(e)), False)
    fields = list(TOOLS[name].args.model_fields)  # parse_call checked their number
    if name == "metric":
        args = [canonical(a) for a in args]
    return {"id": call_id, "tool": name, "arguments": dict(zip(fields, args, strict=True)), "call": call.strip()}


class CallGuide:
    """The decoder's guide (model.params.Guide) for the calls the server runs: each metric
    argument a name the question holds whole, or one the sample dataset holds, each calc number
    one the question or a result holds, or 100 (guided_call), so a name or a number is
    copied, not miscopied ("st1m7" -> "s1m7" is refused: the model's most probable token that
    keeps a name is taken instead).  In a call of a tool in `unguided` (the client's: it names
    what its client holds), and in a calc with no number known, only the call's form is guided
    (call_form: its tool's number of quoted arguments, then `)</call>`), but a client's function
    of one text (calc's shape) whose question writes names and no number: its argument is one of
    those names (text_call), filled from the question's facts, or of `texts` where given (the
    names the question gives the one parameter the model writes of a function whose others it
    fills: domain/arguments.py), in the model's slot form.  With `tools` (a response's tools:
    the ones offered), a call names one of them.  Outside a call it does not guide.  A pure
    function of the segment's tokens: the same on every worker."""

    def __init__(self, tok: Tokenizer, names: CallNames, unguided: Sequence[str] = (),
                 tools: Collection[str] | None = None, texts: Sequence[str] | None = None) -> None:
        self._tok, self._names = tok, names
        self._tools = None if tools is None else frozenset(tools)
        self._unguided = tuple(f"{t}(" for t in unguided)
        written = tuple(text_arguments(names.question)) if texts is None else tuple(texts)
        self._texts = written if "calc" in unguided else ()
        self._call = Profile.markup(tok, CALL)
        self._last: tuple[tuple[int, ...], tuple[list[int], int, str] | None] = ((), None)  # a refused position asks about many tokens

    def allows(self, before: Sequence[int], token: int) -> bool | None:
        key = tuple(before)
        last = self._last  # one read: the batcher's loop and a job's thread may both ask
        head = last[1] if last[0] == key else self._head(before)
        self._last = (key, head)
        if head is None:
            return None
        ids, at, text = head
        call = self._tok.decode([*ids, token])[at:]  # in context: a character may take two tokens
        if call.endswith("\ufffd"):  # a character's first bytes, judged once it is whole
            return None
        verdict: bool | None
        if self._texts and call.startswith(_TEXT_CALL):
            verdict = text_call(call, self._texts)
        else:
            verdict = None if call.startswith(self._unguided) else guided_call(call, self._names)  # the client's: its names
        if verdict is None:
            verdict = call_form(call, self._tools)
        # a token that writes nothing (an id the tokenizer lacks) is no way on inside a call
        return False if verdict is not None and call == text else verdict

    def _head(self, before: Sequence[int]) -> tuple[list[int], int, str] | None:
        """(ids, at, text): the ids that decode to the last `<call>` and what follows it, the
        offset of what follows in their text, and that text; None: no call, or it has ended."""
        if len(self._call) == 1:  # setflow's vocabularies: one id, found without decoding the segment
            cid = self._call[0]
            i = next((i for i in range(len(before) - 1, -1, -1) if before[i] == cid), None)
            if i is None:
                return None
            ids, at = list(before[i + 1:]), 0
            text = self._tok.decode(ids)
        else:
            ids = list(before)
            full = self._tok.decode(ids)
            at = full.rfind(CALL)
            if at < 0:
                return None
            at += len(CALL)
            text = full[at:]
        return None if END_CALL in text else (ids, at, text)


_TEXT_CALL = 'calc("'  # a call of one argument, up to it


def text_call(call: str, texts: Collection[str]) -> bool:
    """call: the text after `<call>` so far, from `calc("` on.  Whether it can still become
    `calc("<one of texts>")</call>`: a client's function of one text argument called with a name
    its question writes (domain/answers.py text_arguments), copied whole."""
    arg, quote, tail = call[len(_TEXT_CALL):].partition('"')
    if not quote:
        return any(t.startswith(arg) for t in texts)
    return arg in texts and (")" + END_CALL).startswith(tail)


def call_form(call: str, tools: Collection[str] | None) -> bool | None:
    """call: the text after `<call>` so far.  Whether it can still become a call as training
    writes it, `name("a", "b", "c")</call>`: a tool of TOOLS (of `tools` where given) and its
    number of quoted arguments, none empty, none across a line.  None where it does not guide:
    the tool's name still being written with no `tools` given, or a name TOOLS lacks (run_call
    answers it)."""
    name, paren, args = call.partition("(")
    known = [t for t in TOOLS if tools is None or t in tools]
    if not paren:
        return None if tools is None else any(t.startswith(name) for t in known)
    if name not in known:
        return None if tools is None else False
    n = len(TOOLS[name].args.model_fields)
    parts = args.split('"')  # argument k at 2k + 1, what follows it at 2k + 2
    if parts[0] or len(parts) > 2 * n + 1:
        return False
    for k in range(1, len(parts)):
        part, last = parts[k], k == len(parts) - 1
        if k % 2:  # an argument
            if "\n" in part or (not part and not last):
                return False
        else:  # the separator after it, or the call's end after the last
            rest = ", " if k < 2 * n else ")" + END_CALL
            if not (rest.startswith(part) if last else part == rest):
                return False
    return True


class ForcedCall:
    """The guide of a segment that must call a tool (a response's tool_choice, `required` or a
    named function): its text begins with `<call>` and the tool's name and `(` (`<call>` alone
    where any tool will do), written as the head's own tokens (its encoding), or by a token that
    writes the rest of it whole and goes on ('("'); a token that writes a part of the name no
    likely token goes on from ("c", then "alc") is no way on: the model left the guide there and
    wrote `calc("(", "[F31]...`.  Once written, `inner` (the calls' guide) decides.  A pure
    function of the segment's tokens: the same on every worker."""

    def __init__(self, tok: Tokenizer, tool: str | None, inner: Guide | None) -> None:
        self._tok, self._inner = tok, inner
        self._head = f"{CALL}{tool}(" if tool is not None else CALL
        self._ids = tuple(tok.encode(self._head))
        self._written: tuple[int, ...] | None = None  # the first tokens that wrote the head

    def allows(self, before: Sequence[int], token: int) -> bool | None:
        w = self._written
        if w is not None and len(before) >= len(w) and tuple(before[:len(w)]) == w:
            return self._inner.allows(before, token) if self._inner is not None else None
        text = self._tok.decode(list(before))
        if text.startswith(self._head):
            self._written = tuple(before)
            return self._inner.allows(before, token) if self._inner is not None else None
        longer = self._tok.decode([*before, token])
        if longer == text:  # a token that writes nothing is no way on
            return False
        if longer.startswith(self._head):  # the head's rest whole, and on
            return True
        k = len(before)
        return k < len(self._ids) and tuple(before) == self._ids[:k] and token == self._ids[k]


class UnitGuide:
    """The answer's guide for units: after a result's slot (and a space or two), no token that
    starts a unit the checker would refuse after that number (answers.unit_problems: a total of a
    tenant's table, of a client's tool or plain arithmetic has none; a sample metric its own; a
    percent change is in %), and right after the slot no letter or digit that does not start an
    allowed unit (a word glued to the number reads as another number), so the model's most
    probable other token is taken and the answer states the number as its rows give it.  `inner`
    (the calls' guide) decides inside a call.  `results`: each result's slot id -> its value;
    `made`: the calls so far.  A pure function of the segment's tokens: the same on every worker."""

    def __init__(self, tok: Tokenizer, inner: Guide | None, made: Sequence[tuple[str, str]],
                 results: dict[int, str], units: bool) -> None:
        self._tok, self._inner = tok, inner
        self._units: dict[int, tuple[list[str], list[str]]] = {}  # slot id -> (units refused, units allowed)
        for i, v in results.items():
            ok = [u for u in UNITS if not unit_problems(made, f" {v} {u}", units)]
            self._units[i] = ([u for u in UNITS if u not in ok], ok)

    def allows(self, before: Sequence[int], token: int) -> bool | None:
        verdict = self._inner.allows(before, token) if self._inner is not None else None
        if verdict is not None or not self._units:
            return verdict
        i = len(before) - 1
        while i >= max(0, len(before) - 3) and before[i] not in self._units and not self._tok.decode([before[i]]).strip():
            i -= 1  # a space or two between the number and its unit
        if i < 0 or before[i] not in self._units:
            return None
        refused, ok = self._units[before[i]]
        said = self._tok.decode([token])
        glued = i == len(before) - 1 and said[:1].isalnum()  # no space between the number and the token
        said = said.lstrip()
        if not refused and not glued:
            return None

        def starts(u: str) -> bool:  # the token begins the unit, or writes it whole (and more)
            return bool(said) and (u.startswith(said) or said.startswith(u))
        if any(map(starts, ok)):
            return True
        return not glued and not any(map(starts, refused))  # guided here: a stand-in is any other token


class AnswerGuide:
    """The answer's guide for its words: a segment after a result opens as training's do, with a
    call's markup or "A: " (nothing before either, and no end before either: the checker refuses
    a word before the "A:", answers.segment_problems); once it writes "A: " (and no call), a token is
    refused where the answer would stop being the beginning of one of the answer forms training
    writes (domain/answers.py begins_answer: its names those its metric calls read, its number a
    result's), so the model's most probable token that keeps to a form is taken instead; the
    checker still reads the whole answer back (form_problems).  A token `inner` (the units', the
    calls' guide) refuses stays refused; the end (`eos_id`) is allowed, and is the way on from a
    whole answer.  For setflow's models,
    which point at facts: `names` and `results` in slot form; `quote`: the last result's slot
    where that result is words (a client's function's output), the only thing its number may
    be (the answer quotes it; answers.answer_forms).  A pure function of the segment's tokens:
    the same on every worker."""

    def __init__(self, tok: Tokenizer, inner: Guide | None, names: Sequence[Collection[str]], results: Collection[str],
                 eos_id: int | None = None, quote: str | None = None) -> None:
        self._tok, self._inner, self._eos = tok, inner, eos_id
        self._forms = answer_forms(names, results, quote)
        # the forms' words, units and (slot form) facts are ASCII but where a name copied as text
        # is not: only then may a token write a character's first bytes in an answer (after a
        # quote's slot, a byte token "\ufffd" was left unjudged, no form went on from it, and the
        # model wrote on outside the guide: "The result is [F1]\ufffd went for Qo. [F60] mbb bad.")
        self._wide = not all(n.isascii() for field in names for n in field)
        # the text before and where its answer stands (None: a call; _OPENING: neither a call nor
        # "A:" yet): a refused position asks about many tokens after the same text
        self._last: tuple[tuple[int, ...], str, tuple[State, ...] | None] = ((), "", _OPENING)

    def allows(self, before: Sequence[int], token: int) -> bool | None:
        verdict = self._inner.allows(before, token) if self._inner is not None else None
        if verdict is False:
            return False
        mine = self._words(before, token)
        return verdict if mine is None else mine

    def _words(self, before: Sequence[int], token: int) -> bool | None:
        if self._eos is not None and self._eos in before:  # past the end: the decoder cuts there
            return None
        key = tuple(before)
        last = self._last  # one read: the batcher's loop and a job's thread may both ask
        if last[0] != key:
            so_far = self._tok.decode(list(before))
            head, mark, answer = so_far.partition("A:")
            states = None if CALL in head else self._forms.open(answer.removeprefix(" ")) if mark else _OPENING
            last = (key, so_far, states)
            self._last = last
        _, so_far, states = last
        if states is None:  # a call: its own guide's
            return None
        if states is _OPENING:  # a token that writes nothing is no way on
            text = self._tok.decode([*before, token])
            return token != self._eos and text != so_far and self._opens(text)
        if token == self._eos:  # the end: the way on from a whole answer (else the checker says what is missing)
            return True if self._forms.whole(so_far.partition("A:")[2].removeprefix(" ")) else None
        text = self._tok.decode([*before, token])
        if text.endswith("\ufffd"):  # a character's first bytes: judged whole, where a form may hold one
            return None if self._wide else False
        if text == so_far:  # an end, a stop
            return None
        return bool(self._forms.open(text.partition("A:")[2].removeprefix(" "), after=states))

    def _opens(self, text: str) -> bool:
        """`text`, a segment with no call and no answer before it, still opens one training
        writes: a call's markup (its guide takes over), or "A:" and the beginning of an answer
        (none where no form can begin: no result to rest on, only a call goes on)."""
        if text.startswith(CALL) or CALL.startswith(text):
            return True
        head, mark, answer = text.partition("A:")
        if head if mark else not "A:".startswith(text):
            return False
        return bool(self._forms.open(answer.removeprefix(" ")))


_OPENING: tuple[State, ...] = ((-1, -1, -1),)  # AnswerGuide: a segment not yet a call nor an answer
