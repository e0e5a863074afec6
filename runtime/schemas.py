"""Pydantic models of what crosses a process boundary: job specs as submitted (checked by the
submitter, so bad input is refused before any state changes, and again by the worker, which
must not trust a stored payload).  No torch here: the API process imports this."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from runtime.errors import BadInput


class ParamsSpec(BaseModel):
    """model.decode.DecodeParams, as JSON (the worker builds the real one from it)."""

    model_config = ConfigDict(extra="forbid")
    policy: Literal["set", "prefix", "block", "ar"] = "set"
    window: int = Field(default=4, ge=1, le=256)
    tau: float | None = Field(default=0.9, gt=0.0, le=1.0)
    max_new_tokens: int = Field(default=64, ge=0, le=4096)
    temperature: float = Field(default=0.0, ge=0.0, le=10.0)
    seed: int = 0
    stop: list[list[int]] = Field(default_factory=list, max_length=16)
    ignore_eos: bool = False


class TurnSpec(BaseModel):
    """One turn on a session: input as token ids or as text (the worker tokenizes it)."""

    model_config = ConfigDict(extra="forbid")
    input_ids: list[int] | None = Field(default=None, min_length=1)
    text: str | None = Field(default=None, min_length=1)
    params: ParamsSpec = Field(default_factory=lambda: ParamsSpec())

    @model_validator(mode="after")
    def _one_input(self) -> TurnSpec:
        if (self.input_ids is None) == (self.text is None):
            raise ValueError("give exactly one of input_ids and text")
        return self


#: job kind -> its spec model, and whether it runs on a session
SPECS: dict[str, tuple[type[BaseModel], bool]] = {"turn": (TurnSpec, True)}


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
