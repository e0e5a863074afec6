"""The Responses API's request, as OpenAI's clients send it: the input items, the tools, and
setflow's own decoding parameters, which ride in one extension field, `setflow` (the SDK's
`extra_body`).  The request -> a `response` job's spec is mapping.py; the ids, ids.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from model.params import Policy, Seed, Tau, Window
from runtime.api.openai.input_files import file_text
from runtime.jobs.kinds import FunctionTool
from runtime.tables import Priority
from workflows import structured


class Part(BaseModel):
    """A message's content part: text, or a file (input_file: read as its text, a PDF's too:
    input_files.py).  An image is refused: setflow's models read text only."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["input_text", "output_text", "text", "input_file"]
    text: str = Field(max_length=65536)

    @model_validator(mode="before")
    @classmethod
    def _read(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        kind = v.get("type")
        if kind == "input_image":
            raise ValueError("setflow's models read text only: an input_image cannot be read (send its text, "
                             "or a text, CSV, JSON or PDF file as input_file)")
        if kind == "input_file":
            return {"type": "input_file", "text": file_text(v)}
        if kind not in ("input_text", "output_text", "text"):
            raise ValueError(f"a content part is input_text, output_text or input_file (text, CSV, JSON, PDF); "
                             f"{str(kind)[:40]!r} is not one")
        return v


ITEM_TYPES = ("message", "function_call", "function_call_output", "item_reference", "compaction")


def _typed(v: Any) -> Any:
    """An item without a type ({"role", "content"}: the SDK's easy message) is a message; a type
    setflow does not read is refused by name."""
    if isinstance(v, dict) and "type" not in v and "role" in v:
        return {**v, "type": "message"}
    if isinstance(v, dict) and v.get("type") not in ITEM_TYPES:
        raise ValueError(f"an input item is a message, function_call, function_call_output, item_reference or "
                         f"compaction; "
                         f"{str(v.get('type'))[:40]!r} is not one")
    return v


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore")  # status, annotations: what a client re-sends of an output item
    type: Literal["message"] = "message"
    id: str | None = Field(default=None, max_length=128)  # an output message re-sent: msg_<job>_<i> names its response
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]
    phase: Literal["commentary", "final_answer"] | None = None  # an assistant message's, as re-sent: kept, read as text

    @property
    def text(self) -> str:
        """Its text: the parts' in order, a file's on lines of its own."""
        if isinstance(self.content, str):
            return self.content
        text = "".join(p.text if p.type != "input_file" else f"\n{p.text.strip(chr(10))}\n" for p in self.content)
        return text.strip("\n") if any(p.type == "input_file" for p in self.content) else text


class FunctionCallItem(BaseModel):
    """A call the model made, as a client re-sends its history."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call"]
    call_id: str = Field(max_length=128)
    name: str = Field(max_length=64)
    arguments: str = Field(max_length=65536)


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call_output"]
    call_id: str = Field(max_length=128)
    output: str = Field(max_length=65536)


class ItemReference(BaseModel):
    """An item of an earlier response named by its id (msg_, fc_: its output; in_: its input):
    read as that item (chain.py resolves it)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["item_reference"]
    id: str = Field(max_length=128)


class CompactionItem(BaseModel):
    """The item POST /v1/responses/compact made, sent back: read as the messages it keeps
    (compaction.py; chain.py `referenced` expands it)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["compaction"]
    id: str | None = Field(default=None, max_length=128)
    encrypted_content: str = Field(max_length=65536)


Item = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem | ItemReference | CompactionItem,
                 Field(discriminator="type"), BeforeValidator(_typed)]


class BuiltinTool(BaseModel):
    """setflow's own tools, run by the server: the metric lookup (over the tenant's dataset, or
    the sample one) and the calculator."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["setflow_metric", "setflow_calc"]
    dataset: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")  # setflow_metric's table


class NamedChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    name: str


class Extension(BaseModel):
    """setflow's decoding parameters (`extra_body={"setflow": {...}}`); what is left out takes the
    response's defaults (prefix, W 4, tau 0.9 for the agent; the same for text)."""

    # strict as ParamsSpec is: "window": "4" is refused, not read as 4; the bounds are DecodeParams'
    model_config = ConfigDict(extra="forbid", strict=True)
    policy: Policy | None = None
    window: Window | None = None
    tau: Tau | None = None
    seed: Seed | None = None
    max_calls: int | None = Field(default=None, ge=0, le=8)
    ignore_eos: bool | None = None  # decode to max_output_tokens whatever the model ends with
    allow_unverified: bool = False
    priority: Priority = "interactive"
    #: the `setflow:step` events in the stream (each set the model commits): off unless asked,
    #: as a client that validates events refuses one it does not know
    step_events: bool = False


class ContextManagement(BaseModel):
    """A context_management entry: compaction, past `compact_threshold` positions of the session
    a response goes on from (chain.py `_compacted`)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["compaction"]
    compact_threshold: int | None = Field(default=None, ge=1)


class CreateResponse(BaseModel):
    """POST /v1/responses.  Fields OpenAI's clients send that change nothing here are taken,
    echoed on the response, and ignored (parallel_tool_calls, user, include, reasoning,
    service_tier, safety_identifier, prompt_cache_key, prompt_cache_retention, top_logprobs: no
    logprobs are returned); max_tool_calls bounds the agent's calls; one that would change what
    comes back and that setflow does not do is refused (top_p other than 1, a text format other
    than text, json_object or a json_schema it writes: workflows/structured/)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,64}$")
    #: a string (one user message) or items; none where a conversation's added items are the input
    input: Annotated[str, Field(max_length=65536)] | Annotated[list[Item], Field(max_length=256)] = Field(default_factory=list)
    instructions: str | None = Field(default=None, max_length=65536)
    previous_response_id: str | None = Field(default=None, max_length=64)
    conversation: str | dict[str, str] | None = None
    store: bool = True
    background: bool = False
    stream: bool = False
    tools: list[FunctionTool | BuiltinTool] = Field(default_factory=list, max_length=64)
    tool_choice: Literal["auto", "none", "required"] | NamedChoice = Field(default="auto", union_mode="left_to_right")
    max_output_tokens: int | None = Field(default=None, ge=1, le=4096)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = \
        Field(default=None, max_length=16)
    setflow: Extension = Field(default_factory=Extension)
    context_management: list[ContextManagement] | None = Field(default=None, max_length=4)
    # taken, changing nothing here
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(default=None, ge=0)
    user: str | None = Field(default=None, max_length=512)
    safety_identifier: str | None = Field(default=None, max_length=512)
    prompt_cache_key: str | None = Field(default=None, max_length=512)
    prompt_cache_retention: Literal["in-memory", "in_memory", "24h"] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    include: list[Annotated[str, Field(max_length=128)]] | None = Field(default=None, max_length=16)
    truncation: Literal["auto", "disabled"] | None = None
    stream_options: dict[str, Any] | None = None
    top_p: float | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None

    @field_validator("store", "background", "stream", "tools", "tool_choice", mode="before")
    @classmethod
    def _null_is_default(cls, v: Any, info: ValidationInfo) -> Any:
        """null, as OpenAI's reference lists these fields (and some frameworks send it): the default."""
        return cls.model_fields[str(info.field_name)].get_default(call_default_factory=True) if v is None else v

    @model_validator(mode="after")
    def _named_tools(self) -> CreateResponse:
        """A function named twice, or a tool_choice naming none of the tools, is refused (as
        OpenAI does): the model would call a tool the client did not mean."""
        names = [t.name for t in self.tools if isinstance(t, FunctionTool)]
        if len(set(names)) != len(names):
            raise ValueError(f"tools name a function more than once: {sorted(n for n in set(names) if names.count(n) > 1)}")
        if isinstance(self.tool_choice, NamedChoice) and self.tool_choice.name not in names:
            raise ValueError(f"tool_choice names the function {self.tool_choice.name!r}, which tools do not hold")
        return self

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, v: float | None) -> float | None:
        if v is not None and v != 1.0:
            raise ValueError("setflow samples from the whole distribution: top_p is 1 or left out")
        return v

    @field_validator("text")
    @classmethod
    def _format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        structured.requested(v)  # text, json_object, or a json_schema it writes (workflows/structured/), or why not
        return v

    def items(self) -> list[dict[str, Any]]:
        """The input as items (a string: one user message), as stored and listed."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": self.input}]}]
        out = []
        for x in self.input:
            d = x.model_dump(mode="json")
            if isinstance(x, MessageItem):
                kind = "output_text" if x.role == "assistant" else "input_text"
                d["content"] = [{"type": kind, "text": x.text}]
                for k in ("id", "phase"):
                    if d[k] is None:
                        del d[k]
            if isinstance(x, CompactionItem) and x.id is None:
                del d["id"]
            out.append(d)
        return out

    def compact_threshold(self) -> int | None:
        """The least compact_threshold of context_management's compaction entries; None: none."""
        given = [c.compact_threshold for c in self.context_management or [] if c.compact_threshold is not None]
        return min(given) if given else None

    def conversation_id(self) -> str | None:
        c = self.conversation
        return c.get("id") if isinstance(c, dict) else c


class CompactRequest(BaseModel):
    """POST /v1/responses/compact: the history to compact (compaction.py), the
    previous response's chain, then `input`.  `model` is required, as the spec's
    CompactResponseMethodPublicBody has it (a request without it: 400); it, `instructions` and the
    fields the SDK sends beside them are taken and change nothing (no model runs; instructions
    are not carried to the next response)."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")
    input: Annotated[str, Field(max_length=65536)] | Annotated[list[Item], Field(max_length=256)] | None = None
    previous_response_id: str | None = Field(default=None, max_length=64)
    instructions: str | None = Field(default=None, max_length=65536)
    # taken, changing nothing here
    prompt_cache_key: str | None = Field(default=None, max_length=512)
    prompt_cache_retention: Literal["in-memory", "in_memory", "24h"] | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = Field(default=None, max_length=512)
    service_tier: Literal["auto", "default", "fast", "flex", "scale", "priority"] | None = None

    def items(self) -> list[dict[str, Any]]:
        return CreateResponse(input=self.input if self.input is not None else []).items()
