"""The `response` job kind: one response of the Responses API (runtime/api/openai/routes.py),
on its conversation's session.

    mode "text":  one turn; its input the messages' text (the profile's turn format), its output
                  one message: what the model wrote; a JSON document valid against the schema
                  where the request's text.format asks for one (workflows/structured/: the
                  grammar guides it, the document is checked), else unchecked (it was given no fact and no tool,
                  and writes no fact slot and no call markup: PlainText), ended within the
                  response kind's own token limit (PlainText: a client's smaller
                  max_output_tokens is the client's cut, `incomplete` where it cuts)
    mode "agent": workflows/agent.py over the client's functions (each fitting a skill the model
                  has: ResponseSpec.callable) and the built-in tools (calc always: the runtime's
                  arithmetic; the metric lookup where it was asked for); its output the answer as a
                  message, checked as an agent's is, or, where the model calls a function the
                  client runs, a `function_call` item: the response ends there, the session parked
                  at the call (`parked`, kept in the result) and no worker held; the next
                  response carries the call's output and goes on from the parked state

    an imported chat model (a ChatML / Qwen3 profile): workflows/chat.py, whichever the mode

The result's output items have no ids: the API names them after the response (stable on every
read).  `usage` counts positions: what the session held before (read from the KV cache, not
prefilled again: `cached`), what each turn appended (`prefill`) and what it wrote."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from domain.facts import Slots
from domain.markup import SLOT_TOKENS
from domain.tools import CALL, END_CALL, END_RESULT, RESULT
from model.config import ModelConfig
from model.params import DecodeParams
from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.errors import BadInput, NoAnswer, RequiresAction
from runtime.jobs.kinds import FunctionTool, ResponseSpec
from runtime.sessions.turn import TurnResult
from workflows import agent, chat, structured
from workflows.turn import Turns, decode_params, ended, summary, text_of, turn_input, with_stops


def run(turns: Turns, spec: ResponseSpec) -> dict[str, Any]:
    counted = Counted(turns)
    try:
        fmt = structured.requested(spec.request.get("text"))
    except ValueError as e:  # a stored spec is not trusted
        raise BadInput(str(e)) from None
    if fmt is not None and (chat.speaks(turns.profile) or spec.mode != "text"):
        raise BadInput("text.format json_schema and json_object are written by setflow's own models, in a response "
                       "without tools the model calls; not yet by an imported chat model or the agent")
    if chat.speaks(turns.profile):  # an imported chat model: its own template and tool-call format
        out = {**chat.run(counted, spec), "turns": counted.summaries}
    else:
        out = _text(counted, spec, fmt) if spec.mode == "text" else _agent(counted, spec)
    return {**out, "usage": counted.usage()}


def _text(turns: Counted, spec: ResponseSpec, fmt: structured.Format | None = None) -> dict[str, Any]:
    """One turn; incomplete where it stopped at its token limit before its end.  With a format,
    a JSON document: guided by its grammar, checked before it is a success (Unfinished where the
    limit came first)."""
    assert spec.text is not None
    ids = turn_input(turns.profile, turns.tokenizer, spec.text)
    if not ids:
        raise BadInput("the input text encodes to no tokens")
    params = with_stops(turns, decode_params(spec.params))
    if fmt is not None:  # a JSON document: the schema's grammar guides every position
        params = replace(params, guide=structured.JsonGuide(turns.tokenizer, turns.cfg.vocab_size, turns.cfg.eos_id, fmt,
                                                             params.max_new_tokens))
    elif turns.profile.facts == "slots":  # no fact and no tool was given: a slot or a call would point at nothing
        end_by = params.max_new_tokens if params.max_new_tokens >= TEXT_LIMIT else None
        params = replace(params, guide=PlainText(turns.tokenizer, turns.cfg.eos_id, end_by))
    turns.report(text_at=turns.cached + len(ids))  # where its text starts: a stream's deltas follow it from there
    r = turns.turn(ids, params, text=spec.text)
    if fmt is not None:  # checked before it is a success: closed, and valid against the schema
        structured.document(text_of(turns, r.tokens), fmt, ended(turns, r.tokens))
    cut = not ended(turns, r.tokens) and len(r.tokens) >= params.max_new_tokens
    return {"session": r.session, "status": "incomplete" if cut else "completed",
            "incomplete": "max_output_tokens" if cut else None,
            "output": [{"type": "message", "text": text_of(turns, r.tokens)}], "turns": [summary(r)]}


def _agent(turns: Counted, spec: ResponseSpec) -> dict[str, Any]:
    """The agent, from the question or from the parked call; ends at an answer (checked) or at a
    call of the client's function (the function_call item, the state parked with it)."""
    functions = spec.callable()  # skill -> the client's function called for it
    question = spec.asked()
    try:
        a = spec.agent(question)
    except ValidationError as e:  # a stored payload is not trusted
        raise BadInput(f"bad response spec: {e.errors()[0]['msg']}") from None
    parked = agent.Parked.of(spec.parked) if spec.parked is not None else None
    if parked is None and (uncalled := spec.uncalled()) and (spec.force == "calc" and "calc" not in functions
                                                    or not (functions or spec.builtin)):
        # the function the question is for needs what it does not give: no call with a value made up
        raise NoAnswer(f"no function was called: the question does not give what it needs: {'; '.join(uncalled)}",
                       [f"not called: {why}" for why in uncalled])

    def fits(call: dict[str, Any]) -> str | None:
        f = functions[call["tool"]]
        return f.problem(f.arguments(call["arguments"], question))

    try:
        res = agent.run(turns, a, parked, spec.output, fits=fits, offered=spec.offered())
    except RequiresAction as e:
        [call] = e.calls
        f = functions[call["tool"]]
        return {"session": turns.session, "status": "completed", "incomplete": None, "turns": turns.summaries,
                "output": [_function_call(f, call, question)],
                "parked": {**(e.state or {}), "question": question, **({"texts": a.texts} if a.texts is not None else {})},
                "calls": (e.state or {}).get("calls", [])}
    return {"session": res["session"], "status": "completed", "incomplete": None, "turns": turns.summaries,
            "output": [{"type": "message", "text": res["answer"]}], "calls": res["calls"],
            **{k: res[k] for k in ("verified", "attempt", "problems", "retried") if k in res}}


def _function_call(f: FunctionTool, call: dict[str, Any], question: str) -> dict[str, Any]:
    """The item a client runs: its function's name, the arguments under its parameters' names as
    JSON (they fit its schema: agent.run answered the call itself otherwise; those the question
    fills with the one the model wrote, FunctionTool.bind), and the agent's call id (the API
    names it after the response)."""
    return {"type": "function_call", "name": f.name, "call": call["id"], "tool": call["tool"],
            "arguments": json.dumps(f.arguments(call["arguments"], question), ensure_ascii=False)}


#: the response kind's own token limit (ResponseSpec's params default): a text response of
#: setflow's own model ends within it (PlainText); a client's max_output_tokens below it is the
#: client's own cut
TEXT_LIMIT: int = ResponseSpec.model_fields["params"].get_default(call_default_factory=True).max_new_tokens
SENTENCE_END = (".", "!", "?", "\n")  # what a token's text ends with where a sentence ends


class PlainText:
    """A text response's guide: it was given no facts and no tools, so the model's fact slots and
    its call markup (<call>, </call>, <result>, </result>: a question's text often starts a
    lookup, which would reach the client as `<call>metric(...`) are no tokens it may write (its
    most probable other token is taken).

    With `end_by` (a position), the text ends by then, at its end of text (EOS): the shipped
    model learnt to end only the texts of its own use cases, and continues any other ("Say
    hello") without ever making EOS likely.  From a quarter of `end_by` on, a sentence's end
    ('.', '!', '?', a newline) is followed by EOS only; at `end_by`'s last position EOS is the
    only token.  So such a text is whole (`completed`), not cut at the limit.  None: not ended
    here (the client's own max_output_tokens may cut it).  Pure: the same on every worker."""

    def __init__(self, tok: Tokenizer, eos_id: int | None = None, end_by: int | None = None) -> None:
        self._tok, self._eos, self._end_by = tok, eos_id, end_by
        self._refused = frozenset(tok.token_id(t) for t in (*SLOT_TOKENS, CALL, END_CALL, RESULT, END_RESULT)
                                  if tok.has_token(t))

    def allows(self, before: Sequence[int], token: int) -> bool | None:
        if self._end_by is not None and self._eos is not None and self._eos not in before and self._ends(before):
            return token == self._eos
        return token not in self._refused  # every position guided: a refused token's stand-in is any other

    def _ends(self, before: Sequence[int]) -> bool:
        """The text must end at this position (after `before`)."""
        assert self._end_by is not None
        n = len(before)
        if n >= self._end_by - 1:
            return True
        return n >= self._end_by // 4 and self._tok.decode([before[-1]]).endswith(SENTENCE_END)


class Counted:
    """The job's Turns, counting what each turn read and wrote (usage), and keeping each turn's
    summary (a response that ends at a call has no agent result to take them from)."""

    def __init__(self, turns: Turns) -> None:
        self._t = turns
        self.cached = turns.used()  # positions the session held before this job's turns
        self.prefill = 0
        self.written = 0
        self.summaries: list[dict[str, Any]] = []
        self.session = ""

    @property
    def tokenizer(self) -> Tokenizer:
        return self._t.tokenizer

    @property
    def cfg(self) -> ModelConfig:
        return self._t.cfg

    @property
    def profile(self) -> Profile:
        return self._t.profile

    def turn(self, ids: list[int], params: DecodeParams, *, text: str = "", infill: bool = False,
             facts: Slots | None = None) -> TurnResult:
        r = self._t.turn(ids, params, text=text, infill=infill, facts=facts)
        self.prefill += len(ids)
        self.written += len(r.tokens)
        self.summaries.append(summary(r))
        self.session = r.session
        return r

    def used(self) -> int:
        return self._t.used()

    def tool_output(self, call_id: str) -> str | None:
        return self._t.tool_output(call_id)

    def once(self, key: str, fn: Callable[[], Any]) -> Any:
        return self._t.once(key, fn)

    def dataset(self, name: str) -> list[list[str]]:
        return self._t.dataset(name)

    def report(self, **progress: Any) -> None:
        self._t.report(**progress)

    def checked(self, part: str, outcome: str) -> None:
        self._t.checked(part, outcome)

    def usage(self) -> dict[str, int]:
        """Positions: `input` what the model read (the session before, `cached`, and what the
        turns appended, `prefill`), `output` what it wrote."""
        return {"input": self.cached + self.prefill, "cached": self.cached, "prefill": self.prefill,
                "output": self.written}

