"""Pydantic models of what crosses a process boundary: each job kind's spec as submitted (checked
once on its way in, by Dispatcher.submit, so bad input is refused before any state changes; and
by the worker, which must not trust a stored payload), and a waiting job's tool outputs.  The
registry of kinds and the Responses API's spec are runtime/jobs/kinds.py's; a spec's decode
parameters runtime/jobs/params.py's, a dashboard's numbers runtime/jobs/payload.py's.  No torch
here: the API process imports this."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from domain import formats
from domain.facts import SLOT  # plain Python: a fact slot's text, no torch
from domain.grammar import clean_name, number_text
from domain.markup import SPECIAL_TOKENS  # plain Python: text that encodes to a control token
from domain.tools import RESULT_RE
from model.params import TokenId  # plain data, no torch
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


#: a JSON document the job writes after its text, held to this (workflows/structured/ written)
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
    #: what a call of one text (calc's shape) the client runs may take as its argument: the names
    #: its question gives the one parameter the model writes of a function whose others are filled
    #: from the question (domain/arguments.py); None: any name the question writes (text_arguments)
    texts: list[Name] | None = Field(default=None, max_length=64)
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
