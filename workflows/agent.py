"""The `agent` job kind: the model writes text and tool calls; at each `</call>` the tool runs and
`<result>...</result>` is appended by prefill, and decoding resumes from the cached state, until
the model ends its answer (EOS); a job that reaches its call limit or fills its session first has
no answer, and fails ("no_answer").

Each decoding segment (up to a call, or the answer) is a turn of the session, the tool's result
the next turn's input, so a job's session resumes from its cached state (warm, or from Redis on
another worker) and can be read, forked or continued with another question.
Tools: workflows/tools.py (their semantics are domain.agent's, as in training).

A tool the spec names in `client_tools` is run by the job's client: at its call the workflow
raises RequiresAction and the job waits, holding no worker; once the client has sent the output
the job runs again from the top, its committed turns replayed (not decoded) and the output read
where the call was (Turns.tool_output), so the session resumes after the call from its cached
state, on whichever worker takes it.
A tool run here on the tenant's dataset (which may change meanwhile) has its result recorded
with the job on its first run and replayed by every rerun (Turns.once), as the session holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from domain import agent as corpus
from domain.agent_facts import AgentFacts, source_names
from domain.answers import answer_of, segment_problems, slot_problems, verify
from domain.facts import SLOT, Slots
from domain.guide import CallNames
from domain.tools import (
    CALL,
    END_CALL,
    END_RESULT,
    RESULT,
    SAMPLE_NAMES,
    Dataset,
    ToolError,
    error_result,
    held_names,
    is_text,
    parse_call,
)
from model.params import DecodeError, DecodeParams, Guide
from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.errors import BadInput, NoAnswer, RequiresAction, Unverified
from runtime.jobs.specs import AgentSpec
from runtime.sessions.turn import TurnResult
from workflows import structured, tools
from workflows.checked import Retry, check
from workflows.turn import DEFAULT, Turns, decode_params, ended, summary, text_of, with_stops


def agent_input(tok: Tokenizer, question: str, profile: Profile = DEFAULT) -> list[int]:
    """An agent's first input: the profile's `agent` format around the question."""
    return profile.render("agent", corpus.prompt_text(question), tok)


@dataclass
class Parked:
    """An agent stopped at a call its client runs, as JSON (RequiresAction.state): what a later
    job needs to go on from there on the same session (workflows/responses.py: the next response
    carries the call's output), without the turns it replays.  Its slot table is rebuilt from
    `names` and the results in order, as it was built."""

    names: list[str] | None  # the question's names that became slots (None: facts written out)
    calls: list[dict[str, Any]]  # the calls made before, their results with them
    doc: list[int]  # the document so far: every input and segment, the call's included
    pieces: list[str]  # the assistant's side so far: segments and results, as the model wrote and read them
    pending: dict[str, Any] = field(default_factory=dict)  # the call it waits for ({"id", "tool", "arguments", "call"})

    @classmethod
    def of(cls, state: dict[str, Any]) -> Parked:
        return cls(**{k: state[k] for k in ("names", "calls", "doc", "pieces", "pending")})


#: a client's schema for its calls: why a call's arguments ({"id", "tool", "arguments", "call"}) do
#: not fit it (the call is answered here with that error, and the model may mend it), or None
Fits = Callable[[dict[str, Any]], str | None]


def run(turns: Turns, spec: AgentSpec, parked: Parked | None = None, output: str | None = None,
        fits: Fits | None = None, offered: Collection[str] | None = None) -> dict[str, Any]:
    """Answer spec.question with tools; the result has the transcript, the calls with their
    results, the answer, and each turn's summary (resume path, nfe, timing).

    The answer is the model's last segment only (what follows its "A:"), never text a result
    holds, and it is checked (workflows/checked.py, domain.answers.verify): the calls it rests on
    fit the question (a metric call names what the question names, no call repeats one that gave
    a result, a calc computes from earlier results or the numbers the question writes), and it
    states the number the last call returned and no number that no result and no name in the
    question holds, and (setflow's models) its words outside its facts are those of the answer
    forms training writes (domain/answers.py form_problems), with nothing before its "A:"
    (segment_problems).  Its retry cannot be a turn after
    it (that would see the failed answer): it is the whole document again (the question, the
    calls and their results, as the turns wrote them) as one new input, a document of its own,
    and the answer decoded after it with greedy AR.
    A success is verified (or, allow_unverified, flagged `verified: false`); a job without an
    answer fails NoAnswer ("no_answer"), allow_unverified or not: at the call limit or with its
    session full at once (a retry would write the call again, or has no room), a segment with no
    "A:" or cut at its token limit after the retry."""
    agent = _Agent.of(turns, spec, parked)
    ids, text_in = agent.resume(parked, output) if parked is not None else agent.first_input()
    last = agent.segments(ids, text_in, fits, offered)  # up to the segment that holds no call
    out = agent.answer(last)
    if (fmt := structured.Format.of(spec.format)) is not None:  # its document, after the answer (checked)
        out["document"] = structured.written(turns, fmt, out["text"], decode_params(spec.params))
    return out


@dataclass
class _Agent:
    """One run of the agent: what each segment reads (its params, its facts, its guide's names),
    and the transcript so far."""

    turns: Turns
    spec: AgentSpec
    seg: DecodeParams  # a segment ends at a call, at EOS or at the profile's stops
    end_call: list[int]  # `</call>`: one id in setflow's vocabularies, a multi-token stop sequence in another's
    held: list[str] | None  # facts as slots (setflow's models): the question's names its source holds
    facts: AgentFacts | None  # the slot table: those names, then each result
    names: CallNames | None  # what guided calls copy: the question's names, the sample dataset's
    doc: list[int] = field(default_factory=list)  # the document before the segment being decoded: every input, every segment
    pieces: list[str] = field(default_factory=list)  # the assistant's side: segments and results
    calls: list[dict[str, Any]] = field(default_factory=list)
    read_results: list[str] = field(default_factory=list)  # each call's result as the model read it (a slot, or an error line)
    done: list[dict[str, Any]] = field(default_factory=list)  # each turn's summary
    guide: Guide | None = None  # the last segment's guide: its retry decodes under the same rule

    @classmethod
    def of(cls, turns: Turns, spec: AgentSpec, parked: Parked | None) -> _Agent:
        end_call = Profile.markup(turns.tokenizer, END_CALL)
        seg = with_stops(turns, decode_params(spec.params), end_call)
        # facts as slots (setflow's models): the question's names its source holds, then each result
        held = (parked.names if parked is not None else _names(turns, spec)) if turns.profile.facts == "slots" else None
        facts = AgentFacts.of(spec.question, held) if held is not None else None
        question = facts.question if facts is not None else spec.question
        # the calls' arguments copied from the question, the sample dataset and the results so far
        names = None
        if spec.guided:
            names = CallNames(question) if spec.dataset else CallNames.sample(question)
        return cls(turns, spec, seg, end_call, held, facts, names)

    @property
    def question(self) -> str:
        """The question as the model reads it (its names as slots)."""
        return self.facts.question if self.facts is not None else self.spec.question

    @property
    def texts(self) -> list[str] | None:
        """What a call of one text may take (spec.texts) as the model writes it (its slots)."""
        if self.spec.texts is None:
            return None
        return [self.facts.slots.delexicalise(t) for t in self.spec.texts] if self.facts is not None else self.spec.texts

    @property
    def slots(self) -> Slots | None:
        return self.facts.slots if self.facts is not None else None

    @property
    def units(self) -> bool:
        """The rows read have units: the sample dataset's (a tenant's table or a client's tool: none,
        whether this run still offers that tool or goes on from a call its client answered)."""
        return self.spec.dataset is None and "metric" not in self.spec.client_tools and not any(
            c["by"] == "client" and c["tool"] == "metric" for c in self.calls)

    def written(self, text: str) -> str:
        """What the model wrote, its facts written out."""
        return self.facts.written(text) if self.facts is not None else text

    def read_names(self) -> list[set[str]]:
        """The names the metric calls that gave a result read, per argument (metric, region,
        period), as the model may write them: a slot, or the text it copied (which may hold a
        result's digits: "Xfers 32")."""
        assert self.facts is not None, "names in slot form are a slot model's"
        read: list[set[str]] = [set(), set(), set()]
        for c in self.calls:
            if c["ok"] and c["tool"] == "metric":
                try:
                    args = parse_call(c["call"])[1]
                except ToolError:
                    continue
                for f, a in enumerate(args):
                    read[f].update((a, self.facts.slots.delexicalise(a)))
        return read

    def first_input(self) -> tuple[list[int], str]:
        return agent_input(self.turns.tokenizer, self.question, self.turns.profile), corpus.prompt_text(self.question)

    def resume(self, parked: Parked, output: str | None) -> tuple[list[int], str]:
        """The transcript `parked` kept; the output of the call it waits for is the first input."""
        if output is None:
            raise BadInput(f"the agent waits for the output of {parked.pending.get('id')}")
        self.doc, self.pieces = list(parked.doc), list(parked.pieces)
        for c in parked.calls:
            self.calls.append({k: c[k] for k in ("id", "call", "tool", "result", "ok", "by")})
            self.read_results.append(self.facts.result(c["result"]) if self.facts is not None else c["result"])
        answered = {**parked.pending, "result": output, "ok": not output.startswith("error:"), "by": "client"}
        return self.took({k: answered[k] for k in ("id", "call", "tool", "result", "ok", "by")})

    def took(self, call: dict[str, Any]) -> tuple[list[int], str]:
        """`call` made: its result, as the model reads it, is the next turn's input."""
        self.calls.append(call)
        self.read_results.append(self.facts.result(call["result"]) if self.facts is not None else call["result"])
        text_in = f"{RESULT}{self.read_results[-1]}{END_RESULT}\n"
        self.pieces.append(text_in)
        self.turns.report(calls=len(self.calls))
        return self.turns.tokenizer.encode(text_in), text_in

    def segments(self, ids: list[int], text_in: str, fits: Fits | None, offered: Collection[str] | None) -> TurnResult:
        """Decode segments and run their calls until one holds no call; returns that one's turn
        (the answer's, or one cut at its token limit).  NoAnswer at the call limit, or with the
        session full after a call; RequiresAction (its state a Parked) at a call its client runs."""
        turns, spec, tok = self.turns, self.spec, self.turns.tokenizer
        data = Dataset(spec.dataset_seed)
        forced = spec.first_call is not None  # this run's first segment calls a tool (the request forces it)
        while True:
            # 1) decode a segment: up to a call, the answer's EOS, or its token limit; its calls
            #    guided to copy the question's names and the numbers of the results so far
            guide: Guide | None = None if self.names is None else tools.CallGuide(
                tok, self.names.after(x for c, x in zip(self.calls, self.read_results) if c["ok"]),
                unguided=spec.client_tools, tools=offered, texts=self.texts)
            if self.facts is not None and self.calls:  # the answer's units, after its results' slots
                guide = tools.UnitGuide(tok, guide, [(c["call"], c["result"]) for c in self.calls],
                                        {tok.token_id(x): c["result"] for c, x in zip(self.calls, self.read_results)
                                         if SLOT.fullmatch(x) and tok.has_token(x)}, self.units)
                if spec.guided:  # and its words, those of an answer form
                    last = self.read_results[-1]  # a result in words: the answer quotes its slot
                    guide = tools.AnswerGuide(tok, guide, self.read_names(),
                                              [x for x in self.read_results if SLOT.fullmatch(x)], turns.cfg.eos_id,
                                              quote=last if SLOT.fullmatch(last) and is_text(self.calls[-1]["result"]) else None)
            if forced:
                guide = tools.ForcedCall(tok, None if spec.first_call == "any" else spec.first_call, guide)
                forced = False
            self.guide = guide
            try:
                r = turns.turn(ids, replace(self.seg, guide=guide), text=text_in, facts=self.slots)
            except DecodeError as e:
                if e.code != "context_overflow" or not self.done:
                    raise
                raise NoAnswer(f"the session is full after {len(self.calls)} call(s), before an answer ({e})",
                               ["no answer: the session is full"]) from e
            self.done.append(summary(r))
            self.doc += ids
            text = text_of(turns, r.tokens)
            self.pieces.append(text)
            if not at_call(r.tokens, self.end_call):  # EOS or a stop (the answer), or the segment's token limit
                return r
            self.doc += r.tokens
            if len(self.calls) == spec.max_calls:  # the call limit: this call is not run
                raise NoAnswer(f"the call limit ({spec.max_calls}) was reached before an answer",
                               ["no answer: the call limit was reached"])
            # 2) run the call (here, or its client does: the job waits for the output); its result
            #    is the next turn's input
            try:
                call = _run_call(turns, spec, self.written(text.rsplit(CALL, 1)[-1].removesuffix(END_CALL)),
                                 f"call_{len(self.calls) + 1}", data, fits, offered)
            except RequiresAction as e:  # what a later job needs to go on from here
                e.state = asdict(Parked(self.held, self.calls, self.doc, self.pieces, e.calls[0]))
                raise
            ids, text_in = self.took(call)

    def answer(self, last: TurnResult) -> dict[str, Any]:
        """3) the last segment's answer, verified, or decoded again once; the job's result."""
        turns, spec = self.turns, self.spec
        made = [(c["call"], c["result"]) for c in self.calls]
        answers: list[str | None] = []  # what each read found: the last is the answer the job ends with

        def read(a: TurnResult) -> tuple[str, list[str]]:
            text = text_of(turns, a.tokens)
            answer = answer_of(self.written(text)) if ended(turns, a.tokens) else None
            answers.append(answer)
            if answer is None:
                why = "holds no A:" if ended(turns, a.tokens) else "ended at its token limit"
                return text, [f"no answer: the last segment {why}"]
            # setflow's models: its slots, before written out, and nothing before its "A:"
            pointed = (slot_problems(answer_of(text) or "") + segment_problems(self.written(text))
                       if self.facts is not None else [])
            return text, pointed + verify(spec.question, made, answer, sample=spec.dataset is None, names=self.held,
                                          units=self.units, forms=self.facts is not None, texts=spec.texts)

        retry = Retry(self.doc, replace(self.seg, guide=self.guide),  # the same rule as the segment's
                      corpus.prompt_text(self.question) + "".join(self.pieces[:-1]), facts=self.slots)
        try:
            checked = check(turns, "answer", last, read, retry, allow_unverified=spec.allow_unverified)
        except Unverified as e:
            if answers[-1] is None:
                raise _no_answer(e.problems) from e
            raise
        answer = answers[-1]
        if answer is None:  # flagged, but no answer to flag
            raise _no_answer(checked.problems)
        if checked.attempt == "ar_retry":  # the retry's segment is the transcript's last
            self.pieces[-1] = checked.value
            self.done.append(summary(checked.turn))
        return {"session": last.session, "question": spec.question, "text": self.written("".join(self.pieces)),
                "answer": answer.strip(), "calls": self.calls, "finished": True, "reason": "answer",
                "turns": self.done, **checked.fields()}


def _names(turns: Turns, spec: AgentSpec) -> list[str]:
    """The names of the question that its source holds, its slot table's first slots: the sample
    dataset's; or the tenant's table's as the job first read it, recorded with the job
    (Turns.once) so that a rerun renders the same input even if the table changed meanwhile; or,
    where the client runs the metric tool, the names it declares (spec.names)."""
    if "metric" in spec.client_tools:
        return source_names(spec.question, spec.names)
    if spec.dataset is None:
        return source_names(spec.question, (n for f in SAMPLE_NAMES for n in f))
    dataset = spec.dataset

    def held() -> list[str]:  # the tenant's table as the job first reads it
        table = tools.Table.of(dataset, turns.dataset(dataset))
        return source_names(spec.question, (n for f in held_names(table.values) for n in f))

    names: list[str] = turns.once("names", held)
    return names


def _no_answer(problems: list[str]) -> NoAnswer:
    return NoAnswer(f"the agent ended without an answer: {'; '.join(problems)}", problems)


def _run_call(turns: Turns, spec: AgentSpec, text: str, call_id: str, data: Dataset,
              fits: Fits | None = None, offered: Collection[str] | None = None) -> dict[str, Any]:
    """One call's record ({"id", "call", "tool", "result", "ok", "by"}): run here, or its
    client's output (RequiresAction while there is none).  A call that does not parse, does
    not fit its client's schema, or names a tool not offered, is answered here (its error)."""
    if offered is not None:
        try:
            name = parse_call(text)[0]
        except ToolError:
            name = None  # its error comes back below, as any such call's
        if name is not None and name not in offered:
            return {"id": call_id, "call": text.strip(), "tool": name, "ok": False, "by": "server",
                    "result": error_result(f"no tool {name!r} here; the tools are {sorted(offered)}")}
    if spec.client_tools:
        asked = tools.client_call(text, call_id)
        if isinstance(asked, dict) and asked["tool"] in spec.client_tools:
            why = _stray_slot(asked["arguments"]) or (fits(asked) if fits is not None else None)
            if why is not None:
                return {"id": call_id, "call": asked["call"], "tool": asked["tool"],
                        "result": error_result(why), "ok": False, "by": "server"}
            output = turns.tool_output(call_id)
            if output is None:
                raise RequiresAction([asked])
            return {"id": call_id, "call": asked["call"], "tool": asked["tool"], "result": output,
                    "ok": not output.startswith("error:"), "by": "client"}
    if spec.dataset is None:  # the sample dataset: the same result every time
        run = tools.run_call(text, data)
        return {"id": call_id, "call": run.call.strip(), "tool": run.tool, "result": run.result, "ok": run.ok,
                "by": "server"}
    # the tenant's own dataset, which may change: what it answered is recorded with the job, and a
    # rerun replays that (the session holds that answer already)
    dataset = spec.dataset

    def ask() -> dict[str, Any]:
        run = tools.run_call(text, tools.Table.of(dataset, turns.dataset(dataset), spec.question))
        return {"tool": run.tool, "result": run.result, "ok": run.ok}

    return {"id": call_id, "call": text.strip(), **turns.once(call_id, ask), "by": "server"}


def _stray_slot(arguments: Any) -> str | None:
    """Why a client's call may not go out: an argument still holding a fact slot's text once the
    facts are written out (a slot that names no fact, "[F17]026-Q2"; a question never holds
    one: AgentSpec refuses it); None: none does.  The client would be asked for a name nobody gave."""
    for name, value in arguments.items():
        if isinstance(value, str) and SLOT.search(value):
            return f"{name} {value!r} holds a fact slot that names no fact"
    return None


def at_call(tokens: list[int], end_call: list[int]) -> bool:
    """The segment stopped at a call: it ends with `</call>`'s ids."""
    return len(tokens) >= len(end_call) and tokens[-len(end_call):] == end_call
