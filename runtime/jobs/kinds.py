"""The job kinds: kind -> its spec model (SPECS) and the check each spec passes on its way in
(check_spec, resolved: by Dispatcher.submit, and by the worker, which must not trust a stored
payload); and the kind built over the others, the Responses API's `response` (ResponseSpec: a
text turn, or an agent job over the functions its client declares, FunctionTool).  Each other
kind's spec is runtime/jobs/specs.py's.  No torch here: the API process imports this."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from domain import arguments, schemas  # a tenant's JSON Schema as data: no fetch, RE2 patterns, size caps
from domain.tools import MAX_REASON
from runtime.errors import BadInput
from runtime.jobs.params import ParamsSpec, Tuned, tuned
from runtime.jobs.specs import AgentSpec, InfillSpec, NarrativeSpec, ReportSpec, TurnSpec, _plain

# ---- the Responses API's job (runtime/api/openai/mapping.py builds it; chain.py submits it) -------

#: a skill of setflow's agent models and the parameters a function must have to be called for it:
#: the metric lookup reads a value by three names (what, where, when), calc one expression
SKILLS: dict[str, int] = {"metric": 3, "calc": 1}


class FunctionTool(BaseModel):
    """A function the client runs (the Responses API's function tool).  The shipped model calls
    one whose parameters fit a skill it has (skill()), where its question gives what the
    function needs (bind()); the others are accepted and never called."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function"] = "function"
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(default=None, max_length=4096)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and (why := schemas.problems(v)):
            raise ValueError(f"parameters: {why}")
        return v

    def fields(self) -> list[str]:
        """Its parameters' names in the order the schema gives them."""
        return list(((self.parameters or {}).get("properties") or {}).keys())

    def skill(self) -> str | None:
        """The skill it fits: its parameters an object of 3 (metric: what, where, when, in this
        order; beside them, optional parameters up to 4 in all, filled from the question) or 1
        (calc: an expression, or any one text) required string properties; or, calc's call shape
        too, one of 1 to 4 parameters that are filled from the question but the one text the
        model writes (domain/arguments.py fits: `get_weather(city, unit)`); else None."""
        if self._shape() is not None:
            return self._shape()
        return "calc" if arguments.fits(self.parameters) else None

    def _shape(self) -> str | None:
        """The skill its required parameters fit as they are, each one an argument the model
        writes (a lookup's, with optional others the question fills, bind())."""
        p = self.parameters or {}
        props = p.get("properties") or {}
        required = set(p.get("required") or [])
        if p.get("type") != "object" or not required <= set(props):
            return None
        if not all(isinstance(props[k], dict) and props[k].get("type") == "string" for k in required):
            return None
        if required != set(props) and (len(required) != SKILLS["metric"] or len(props) > arguments.MAX_PARAMETERS
                                       or any(arguments.kind(props[k]) is None for k in props if k not in required)):
            return None
        if len(props) == 1 and "enum" in next(iter(props.values())):  # one value of a list: filled (bind)
            return None
        return next((k for k, n in SKILLS.items() if n == len(required)), None)

    def _written(self) -> list[str]:
        """The parameters the model writes, in the schema's order: the required ones of a lookup
        with optional others (the question fills those), else all."""
        required = set((self.parameters or {}).get("required") or [])
        return [k for k in self.fields() if k in required] if self._shape() == "metric" else self.fields()

    def bind(self, question: str) -> arguments.Binding | None:
        """The arguments `question` gives it, where they are filled from the question
        (domain/arguments.py): all but the one the model writes, or a lookup's optional ones
        (its three names the model's); None where the model writes each (a lookup's three
        names, one text)."""
        p = self.parameters or {}
        if self._shape() == "metric" and len(self._written()) < len(self.fields()):
            optional = {k: v for k, v in p["properties"].items() if k not in self._written()}
            return arguments.bind({"type": "object", "properties": optional}, question, self.name)
        if self._shape() is not None or not arguments.fits(self.parameters):
            return None
        return arguments.bind(p, question, self.name)

    def unfilled(self) -> list[str]:
        """Why no question gives this function what it needs, where it fits no skill but requires
        parameters: each required one that nothing fills (an object, an array of objects, a
        union: domain/arguments.py kind), or more parameters than a question fills; [] where it
        fits a skill or requires none (it is then never called, and says nothing)."""
        p = self.parameters or {}
        props, required = p.get("properties"), p.get("required")
        if self.skill() is not None or p.get("type") != "object" or not isinstance(props, dict) or not required:
            return []
        if len(props) > arguments.MAX_PARAMETERS:
            return [f"it has {len(props)} parameters, and a question fills at most {arguments.MAX_PARAMETERS}"]
        return [f"{k}: {_kind_of(props.get(k))} is not filled from a question" for k in required
                if arguments.kind(props.get(k)) is None]

    def names(self) -> list[str]:
        """The names its schema lists (each string parameter's `enum` the model writes): the
        facts the model reads as slots where a question holds them."""
        props = (self.parameters or {}).get("properties") or {}
        return [str(n) for k in self._written() for n in props[k].get("enum", []) if isinstance(n, str)]

    def listed(self) -> list[bool]:
        """Whether each parameter the model writes lists its values (an `enum`), in the schema's order."""
        props = (self.parameters or {}).get("properties") or {}
        return [bool(isinstance(props[k], dict) and props[k].get("enum")) for k in self._written()]

    def arguments(self, args: dict[str, str], question: str | None = None) -> dict[str, Any]:
        """A call's arguments (by the skill's fields, in order) under this function's names; where
        the question fills some (bind()), those with the ones the model wrote, in the schema's order."""
        binding = self.bind(question) if question is not None else None
        if binding is not None and binding.key is not None:
            [written] = args.values()
            return binding.arguments(written, self.fields())
        given = {**dict(zip(self._written(), args.values(), strict=True)), **(binding.values if binding else {})}
        return {k: given[k] for k in self.fields() if k in given}

    def problem(self, args: dict[str, Any]) -> str | None:
        """Why arguments (under its names) do not fit its schema; None: they do."""
        errors = sorted(schemas.validator(self.parameters or {}).iter_errors(args), key=str)
        return None if not errors else f"{self.name}: {errors[0].message}"[:MAX_REASON]


def _kind_of(prop: Any) -> str:
    """A parameter's schema in words: "an object", "an array of objects", "a union"."""
    t = prop.get("type") if isinstance(prop, dict) else None
    if t == "array":
        return f"an array of {_kind_of((prop or {}).get('items')).removeprefix('an ').removeprefix('a ')}s"
    return {"object": "an object", "string": "a string", "integer": "an integer", "number": "a number",
            "boolean": "a boolean", "null": "a null"}.get(t if isinstance(t, str) else "", "a value of no one type")


_PERIOD = re.compile(r"(?<![\w-])\d{4}-(?:Q[1-4]|H[12]|0[1-9]|1[0-2])(?![\w-])")  # a period in a common form


class ResponseSpec(Tuned):
    """A response of the Responses API, as a job on its conversation's session: a text turn
    (mode "text": no tool to call), or the agent (workflows/agent.py) over the client's functions
    and the built-in tools (mode "agent"), starting from `question` or going on from where the
    previous response stopped at a function call (`parked`, with `output`: the client's)."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["text", "agent"]
    text: str | None = Field(default=None, min_length=1, max_length=65536)  # mode text: the turn's input
    question: str | None = None  # mode agent: the question (AgentSpec's rules), or None going on from `parked`
    functions: list[FunctionTool] = Field(default_factory=list, max_length=64)
    builtin: list[Literal["metric", "calc"]] = Field(default_factory=list, max_length=2)
    dataset: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")  # the built-in metric's table
    parked: dict[str, Any] | None = None  # the previous response's agent state (workflows/agent.Parked, its question)
    output: str | None = Field(default=None, max_length=207)  # the client's output of the parked call
    max_calls: int = Field(default=6, ge=0, le=8)
    params: ParamsSpec = tuned(policy="prefix", window=4, tau=0.9, max_new_tokens=256)
    allow_unverified: bool = False
    #: the input as a chat model reads it (workflows/chat.py): [{"role", "content"}] for each
    #: message (the instructions first, as "system"), [{"role": "tool", "call", "content"}] for
    #: each function call's output; setflow's own models read `text` or `question` instead
    messages: list[dict[str, str]] = Field(default_factory=list, max_length=256)
    #: the client's outputs of a chat model's parked calls: call id ("call_<n>") -> output
    outputs: dict[str, str] = Field(default_factory=dict, max_length=64)
    #: what the client sent (its input items, instructions, tools, metadata...): the API echoes
    #: it in the response object; the workflow reads none of it
    request: dict[str, Any] = Field(default_factory=dict)
    #: the job of the response this one went on from (None: a new session): the API follows
    #: these links to see that a response descends from another; the workflow reads none of it
    previous: str | None = Field(default=None, pattern=r"^[0-9a-f]{24}$")
    #: the tool its first decode must call (tool_choice `required` or a named function:
    #: runtime/api/openai/mapping.forced); None: the model chooses
    force: Literal["metric", "calc", "any"] | None = None

    @field_validator("text")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        return None if v is None else _plain(v)

    @model_validator(mode="before")
    @classmethod
    def _from_messages(cls, v: Any) -> Any:
        """The input is stored once, as the request's items: `messages` are its instructions (as
        "system") and its messages' texts, in order; a text response's text is their contents,
        each a line; an agent's question (not going on from a parked call) is the last user
        message's."""
        if not isinstance(v, dict):
            return v
        req = v.get("request")
        if "messages" not in v and isinstance(req, dict) and isinstance(req.get("items"), list):
            said = [x for x in req["items"] if isinstance(x, dict) and x.get("type") == "message"]
            v = {**v, "messages": ([{"role": "system", "content": req["instructions"]}] if req.get("instructions") else [])
                 + [{"role": x.get("role"), "content": "".join(p.get("text", "") for p in x.get("content") or [])}
                    for x in said]}
        if not isinstance(v.get("messages"), list):
            return v
        contents = [m.get("content") for m in v["messages"] if isinstance(m, dict)]
        if v.get("mode") == "text" and v.get("text") is None and contents:
            return {**v, "text": "\n".join(str(c) for c in contents) + "\n"}
        users = [m.get("content") for m in v["messages"] if isinstance(m, dict) and m.get("role") == "user"]
        if v.get("mode") == "agent" and v.get("question") is None and v.get("parked") is None and users:
            return {**v, "question": users[-1]}
        return v

    @model_validator(mode="after")
    def _one_input(self) -> ResponseSpec:
        if self.mode == "text" and self.text is None:
            raise ValueError("a text response has a text")
        if self.mode == "agent" and (self.question is None) == (self.parked is None):
            raise ValueError("an agent response has a question, or goes on from a parked call")
        if self.parked is not None and self.output is None and not self.outputs:
            raise ValueError("a parked call goes on with its output")
        if self.question is not None:
            self.agent(self.question)  # its rules (ValueError names what is wrong)
        return self

    def offered(self) -> list[str]:
        """The tools the model may call: calc always (the runtime's arithmetic, exact: no number
        the model computes itself), the metric lookup where a function fits it or it was asked
        for as a built-in."""
        return sorted({"calc", *self.builtin, *self.callable()})

    def agent(self, question: str) -> AgentSpec:
        """The agent job this response runs: its client tools the skills its functions fit, the
        names their schemas list (those its question holds enter the model as slots), and, where
        the lookup's function lists its what and where but not its when (the README's `quarter`),
        the periods the question writes in a common form (2026-Q3, 2026-03, 2026-H1): with no
        slot to copy, the model miscopied them in a second call ("[F17]026-Q3") and ended with
        no answer.  (Where it lists none, the periods stay text too: periods alone as slots
        misled the model more than none.)"""
        functions = self.callable(question)
        names = [n for f in functions.values() for n in f.names()]
        if "metric" in functions and functions["metric"].listed() == [True, True, False]:
            names += _PERIOD.findall(question)
        bound = functions["calc"].bind(question) if "calc" in functions else None
        texts = list(bound.choices) if bound is not None else (self.parked or {}).get("texts")  # the tools not sent again
        first = self.force
        if first is None and bound is not None and self.parked is None and "metric" not in self.offered():
            first = "calc"  # its question gives what it needs: the answer rests on its call (none is verified without)
        return AgentSpec.model_validate({
            "question": question, "max_calls": self.max_calls, "params": self.params.model_dump(),
            "dataset": self.dataset, "allow_unverified": self.allow_unverified, "client_tools": list(functions),
            "names": list(dict.fromkeys(names)), "first_call": first,
            **({"texts": texts} if texts is not None else {})})

    def asked(self) -> str:
        """The question: this response's, or the one the parked call was made for."""
        return self.question if self.question is not None else str((self.parked or {}).get("question", ""))

    def callable(self, question: str | None = None) -> dict[str, FunctionTool]:
        """skill -> the client's function called for it: the first that fits it and, where its
        arguments are filled from the question (FunctionTool.bind), whose question (this
        response's by default) gives each it needs."""
        asked = self.asked() if question is None else question
        out: dict[str, FunctionTool] = {}
        for f in self.functions:
            skill = f.skill()
            if skill is None or skill in out or skill in self.builtin:
                continue
            binding = f.bind(asked)
            if binding is None or not binding.missing:
                out[skill] = f
        return out

    def uncalled(self) -> list[str]:
        """Why each function whose arguments are filled from the question is not called for it
        ("get_weather: unit: the question writes none of its values ('c', 'f')"), and each whose
        required parameters nothing fills (FunctionTool.unfilled: "create_event: event: an object
        is not filled from a question"); [] where none is so."""
        asked, called = self.asked(), {id(f) for f in self.callable().values()}
        return [f"{f.name}: {'; '.join(b.missing)}" for f in self.functions
                if id(f) not in called and (b := f.bind(asked)) is not None and b.missing] + \
            [f"{f.name}: {'; '.join(u)}" for f in self.functions if (u := f.unfilled())]


# ---- the registry: every kind's spec, and the check a spec passes on its way in ----------------------

#: job kind -> its spec model, and whether it runs on a session (the API opens one for a job
#: submitted without: each job's turns are a session, which can be read, forked and resumed)
SPECS: dict[str, tuple[type[BaseModel], bool]] = {
    "turn": (TurnSpec, True), "infill": (InfillSpec, True), "narrative": (NarrativeSpec, True),
    "agent": (AgentSpec, True), "report": (ReportSpec, True), "response": (ResponseSpec, True)}


def resolved(parsed: BaseModel, spec: dict[str, Any]) -> dict[str, Any]:
    """The spec to store: as sent, but each params field whole (the workflow's defaults for what
    was left out, an explicit null kept), so that it means the same to every reader: a retry,
    a worker of another version, whatever its defaults."""
    return {**spec, **{name: value.model_dump() for name, value in parsed if isinstance(value, ParamsSpec)}}


def check_spec(kind: str, spec: Any, session: str | None) -> BaseModel:
    """The spec as its model; BadInput (with pydantic's reasons) when it is not one."""
    if kind not in SPECS:
        raise BadInput(f"unknown job kind {kind!r}; known: {sorted(SPECS)}")
    model, needs_session = SPECS[kind]
    if needs_session and session is None:
        raise BadInput(f"a {kind!r} job runs on a session: give its id")
    if not isinstance(spec, dict):
        raise BadInput(f"a job spec is a JSON object, got {type(spec).__name__}")
    try:
        return model.model_validate(spec)
    except ValidationError as e:
        reasons = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'spec'}: {err['msg']}" for err in e.errors())
        raise BadInput(f"bad {kind} spec: {reasons}") from None
