"""Pydantic models of what crosses a process boundary: job specs as submitted (checked once on
their way in, by Dispatcher.submit, so bad input is refused before any state changes; and by the
worker, which must not trust a stored payload).  A spec's decode parameters are
runtime/jobs/params.py's, a dashboard's numbers runtime/jobs/payload.py's.  No torch here: the
API process imports this."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from domain import formats, schemas  # a tenant's JSON Schema as data: no fetch, RE2 patterns, size caps
from domain.facts import SLOT  # plain Python: a fact slot's text, no torch
from domain.grammar import clean_name, number_text
from domain.markup import SPECIAL_TOKENS  # plain Python: text that encodes to a control token
from domain.tools import MAX_REASON, RESULT_RE
from model.params import TokenId  # plain data, no torch
from runtime.errors import BadInput
from runtime.jobs.params import ParamsSpec, Tuned, tuned
from runtime.jobs.payload import Name, PayloadSpec

HOLE = "<hole>"  # one masked token in an infill text
MAX_TOOL_WAIT_S = 30 * 24 * 3600.0  # a job waits for its client's tool outputs for at most this


def _format(v: dict[str, Any] | None) -> dict[str, Any] | None:
    """A job's `format` (the Responses API's text.format: json_schema or json_object; text: none),
    checked as the Responses API checks one (domain/formats.py: ValueError with the reason)."""
    try:
        formats.Format.of(v)
    except ValueError as e:
        raise ValueError(str(e).replace("text.format", "format")) from None
    return v


#: a JSON document the job writes after its text, held to this (workflows/structured.py written)
FormatField = Annotated[dict[str, Any] | None, AfterValidator(_format)]


def _plain(v: str, allowed: tuple[str, ...] = ()) -> str:
    """Free text must not smuggle control tokens into the model's input ([MASK] would become a
    hole, [BOS] a new document): refused, naming the token.  Nor a NUL, which no SQL text column
    takes (PostgreSQL refuses it when the turn's row is written: refused here, before anything)."""
    if "\x00" in v:
        raise ValueError("text must not contain a NUL character (U+0000)")
    for special in SPECIAL_TOKENS:
        if special in v and special not in allowed:
            raise ValueError(f"{special} is a control token, not text" + (
                f" (write a hole as {HOLE})" if special == "[MASK]" else ""))
    return v


class TurnSpec(Tuned):
    """One turn on a session: input as token ids or as text (the worker tokenizes it)."""

    model_config = ConfigDict(extra="forbid")
    input_ids: list[TokenId] | None = Field(default=None, min_length=1)
    text: str | None = Field(default=None, min_length=1)
    params: ParamsSpec = Field(default_factory=lambda: ParamsSpec())

    @field_validator("text")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        return None if v is None else _plain(v, allowed=("[BOS]", "[EOS]"))  # a new document may start

    @model_validator(mode="after")
    def _one_input(self) -> TurnSpec:
        if (self.input_ids is None) == (self.text is None):
            raise ValueError("give exactly one of input_ids and text")
        return self


class InfillSpec(Tuned):
    """A template whose `<hole>` markers (one per token) are decoded in place, appended to the
    session: the text around the holes is context on both sides; positions never shift."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, max_length=16384)
    params: ParamsSpec = tuned(policy="set", window=8, tau=0.7)

    @field_validator("text")
    @classmethod
    def _has_hole(cls, v: str) -> str:
        if HOLE not in v:
            raise ValueError(f"an infill text marks at least one hole as {HOLE}")
        return _plain(v, allowed=("[BOS]", "[EOS]"))



#: what a job's exports show (GET /v1/jobs/{id}/report.{fmt}; domain/document.py): `summary` the
#: first sentence (a report's key figures) and the charts, `standard` the text, charts and main
#: drivers, `full` also every driver and the breakdown table.  A narrative's text at `full` says
#: its breakdown's drivers too (the row that added most to the change, its share, the rows that
#: moved against it: facts the model points at); the rest is the export's
Detail = Literal["summary", "standard", "full"]


class NarrativeSpec(Tuned):
    """One dashboard narrative from a metrics payload."""

    model_config = ConfigDict(extra="forbid")
    payload: PayloadSpec
    #: max_new_tokens: the longest narrative the forms write for MAX_METRICS metrics and MAX_ROWS
    #: rows, in slot form, is 384 tokens and its EOS (433 with the drivers of detail `full`; the
    #: shipped tokenizer with the slots; its prompt 291): 512 cuts no narrative the checker could pass
    params: ParamsSpec = tuned(policy="prefix", window=8, tau=0.99, max_new_tokens=512)
    #: a narrative that fails its checker, also after the greedy AR retry, comes back flagged
    #: (`verified: false`, its problems) instead of failing the job with "unverified"
    allow_unverified: bool = False
    #: its decoding is guided: a token that would make the text no longer one the narrative's
    #: forms write for the payload is refused, the model's most probable allowed one taken
    #: (workflows/narrative.py FormGuide; setflow's own models; False: the model's tokens as they are)
    guided: bool = True
    detail: Detail = "standard"
    #: who it is for (a label the exports print under the title; the model does not read it)
    audience: Name | None = None
    format: FormatField = None

    @property
    def drivers(self) -> bool:
        """Its text says the breakdown's drivers (detail `full`)."""
        return self.detail == "full"


class AgentSpec(Tuned):
    """A question answered with tools (a calculator, a metric lookup over the sample dataset
    `dataset_seed` names, or over the tenant's own `dataset`, or run by the client:
    `client_tools`); each decoding segment (up to a tool call, or the answer) is a turn."""

    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=400, pattern=r"^[^\x00-\x1f\x7f-\x9f<>]+$")
    dataset_seed: int = Field(default=2026, ge=0, lt=2**31)
    max_calls: int = Field(default=6, ge=0, le=8)
    #: per segment (a call, or the answer): an answer restates the question's names, spelled
    #: letter by letter (96 cut one in 30 over names of any length before it stated its number)
    params: ParamsSpec = tuned(policy="prefix", window=4, tau=0.9, max_new_tokens=256)
    #: an answer that fails its checker (it must state the number its last tool returned), also
    #: after the greedy AR retry, comes back flagged (`verified: false`, its problems) instead of
    #: failing the job with "unverified"
    allow_unverified: bool = False
    #: the tools the job's client runs (on its own data or services): at such a call the job
    #: waits (requires_action) for POST /v1/jobs/{id}/tool_outputs, holding no worker
    client_tools: list[Literal["metric", "calc"]] = Field(default_factory=list, max_length=2)
    #: how long the job waits for its client's outputs, per call (None: the tool_wait_s setting)
    tool_timeout_s: float | None = Field(default=None, gt=0, le=MAX_TOOL_WAIT_S)
    #: the tenant's own dataset (PUT /v1/datasets/{name}) the metric tool reads, instead of the
    #: sample dataset dataset_seed draws
    dataset: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    #: the calls the server runs are guided: each metric argument a name the question holds whole
    #: (or, over the sample dataset, one it holds), each calc number one the question or a result
    #: holds (or 100), so it is copied, never miscopied (False: the model's tokens as they are)
    guided: bool = True
    #: names the client's own metric tool knows (client_tools: metric): those the question holds
    #: enter the model as slots, as a dataset's do (a question's other names stay text, copied)
    names: list[Name] = Field(default_factory=list, max_length=256)
    #: the tool the run's first segment must call (a response's tool_choice: a named function's
    #: skill, or "any" tool), guided from its first token (workflows/tools.ForcedCall); None: the
    #: model chooses
    first_call: Literal["metric", "calc", "any"] | None = None
    format: FormatField = None

    # the names in a question as a dataset's rows hold them (clean_name): NFC, no spaces
    # (U+0020) at its ends, a run of them one; in any script.  The model reads it as text: no
    # control token (_plain; markup is refused by the pattern's <>), no fact slot's text either
    @field_validator("question")
    @classmethod
    def _question(cls, v: str) -> str:
        v = clean_name(_plain(v))
        if not v:
            raise ValueError("a question has more than spaces")
        slot = SLOT.search(v)
        if slot is not None:
            raise ValueError(f"{slot[0]} is a fact slot of the model, not text")
        return v

    @field_validator("client_tools")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"client_tools names a tool twice: {v}")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> AgentSpec:
        if self.dataset is not None and "metric" in self.client_tools:
            raise ValueError("the metric tool runs on the client (client_tools): it reads no dataset here")
        return self


# ---- the Responses API's job (runtime/api/routes/responses.py builds it from the request) --------

#: a skill of setflow's agent models and the parameters a function must have to be called for it:
#: the metric lookup reads a value by three names (what, where, when), calc one expression
SKILLS: dict[str, int] = {"metric": 3, "calc": 1}


class FunctionTool(BaseModel):
    """A function the client runs (the Responses API's function tool).  The shipped model calls
    one whose parameters fit a skill it has (skill()); the others are accepted and never called."""

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
        order) or 1 (calc: an expression) properties, each a string, each required; else None."""
        p = self.parameters or {}
        props = p.get("properties") or {}
        if p.get("type") != "object" or set(p.get("required") or []) != set(props):
            return None
        if not all(isinstance(x, dict) and x.get("type") == "string" for x in props.values()):
            return None
        return next((k for k, n in SKILLS.items() if n == len(props)), None)

    def names(self) -> list[str]:
        """The names its schema lists (each string parameter's `enum`): the facts the model
        reads as slots where a question holds them."""
        props = (self.parameters or {}).get("properties") or {}
        return [str(n) for x in props.values() for n in x.get("enum", []) if isinstance(n, str)]

    def listed(self) -> list[bool]:
        """Whether each parameter lists its values (an `enum`), in the schema's order."""
        props = (self.parameters or {}).get("properties") or {}
        return [bool(isinstance(x, dict) and x.get("enum")) for x in props.values()]

    def arguments(self, args: dict[str, str]) -> dict[str, str]:
        """A call's arguments (by the skill's fields, in order) under this function's names."""
        return dict(zip(self.fields(), args.values(), strict=True))

    def problem(self, args: dict[str, str]) -> str | None:
        """Why arguments (under its names) do not fit its schema; None: they do."""
        errors = sorted(schemas.validator(self.parameters or {}).iter_errors(args), key=str)
        return None if not errors else f"{self.name}: {errors[0].message}"[:MAX_REASON]


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
    #: runtime/api/responses.forced); None: the model chooses
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
        functions = self.callable()
        names = [n for f in functions.values() for n in f.names()]
        if "metric" in functions and functions["metric"].listed() == [True, True, False]:
            names += _PERIOD.findall(question)
        return AgentSpec.model_validate({
            "question": question, "max_calls": self.max_calls, "params": self.params.model_dump(),
            "dataset": self.dataset, "allow_unverified": self.allow_unverified, "client_tools": list(functions),
            "names": list(dict.fromkeys(names)), "first_call": self.force})

    def callable(self) -> dict[str, FunctionTool]:
        """skill -> the client's function called for it (the first that fits it)."""
        out: dict[str, FunctionTool] = {}
        for f in self.functions:
            skill = f.skill()
            if skill is not None and skill not in out and skill not in self.builtin:
                out[skill] = f
        return out


class SectionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: Name
    metrics: list[Name] = Field(min_length=1, max_length=2)  # keys or custom names of the report data's metrics

    @field_validator("metrics")
    @classmethod
    def _once(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):  # names as the data's metrics name themselves (Name: NFC, canonical)
            raise ValueError("each metric at most once per section")
        return v


class ReportSpec(Tuned):
    """A report over one dataset: a section per outline item (each a turn of one session, so
    the earlier sections stay in its cache), then, if `summary`, a key-figures template whose
    numbers and words are filled by infill."""

    model_config = ConfigDict(extra="forbid")
    title: Name
    data: PayloadSpec
    outline: list[SectionSpec] = Field(min_length=1, max_length=6)
    summary: bool = True
    #: max_new_tokens, per section: the longest body the forms write for a section's 2 metrics
    #: and a MAX_ROWS-row breakdown is 206 tokens and its EOS (without a breakdown: 67); 216 keeps
    #: a 6-section report of 8 metrics, 2 a section, in 2048 positions (2042 with its key figures)
    params: ParamsSpec = tuned(policy="prefix", window=8, tau=0.99, max_new_tokens=216)
    infill_params: ParamsSpec = tuned(policy="set", window=8, tau=0.7)
    #: a section or the key figures failing their checker, also after the greedy AR retry, come
    #: back flagged (`verified: false`, their problems) instead of failing the job with "unverified"
    allow_unverified: bool = False
    #: each section's decoding is guided, as a narrative's is (NarrativeSpec.guided)
    guided: bool = True
    detail: Detail = "standard"
    #: who it is for (a label the exports print under the title; the model does not read it)
    audience: Name | None = None

    @model_validator(mode="after")
    def _known_metrics(self) -> ReportSpec:
        have = {m.label for m in self.data.metrics}
        for s in self.outline:
            missing = [k for k in s.metrics if k not in have]
            if missing:
                raise ValueError(f"section {s.title!r} uses metrics not in data: {missing}")
        return self


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


class ToolOutput(BaseModel):
    """The client's output of one call its job waits for: a number as the tools write it
    (2.4, -12.5, 1240: a string, or a JSON number read as a payload's is) or "error: <reason>",
    which the model reads as it read its tools' in training."""

    model_config = ConfigDict(extra="forbid")
    call_id: str = Field(pattern=r"^call_[0-9]{1,3}$")
    output: str = Field(min_length=1, max_length=207, pattern=f"^(?:{RESULT_RE})$")

    _plain_output = field_validator("output")(classmethod(lambda cls, v: _plain(v)))

    @field_validator("output", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        """A JSON number as a payload's is read (domain/grammar.py number_text: 0.1 + 0.2 is 0.3)."""
        return number_text(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


class ToolOutputs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool_outputs: list[ToolOutput] = Field(min_length=1, max_length=8)

    @field_validator("tool_outputs")
    @classmethod
    def _one_each(cls, v: list[ToolOutput]) -> list[ToolOutput]:
        ids = [o.call_id for o in v]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a call has two outputs: {ids}")
        return v
