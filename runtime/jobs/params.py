"""ParamsSpec: model.params.DecodeParams as a request gives it, derived from the dataclass (one
field list: its names, types, defaults and bounds), strict; and the per-workflow defaults a
spec's params start from.  Knows nothing of the job kinds; no torch (model/params.py has none)."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from model.params import DecodeParams


def _fields_of(cls: type[Any]) -> dict[str, Any]:
    """name -> (annotation, pydantic Field) of each of the dataclass's fields a request may set
    (metadata INTERNAL: not), with its default and the bounds its annotation carries."""
    hints = get_type_hints(cls, include_extras=True)  # the bounds: Annotated[int, Ge(1), Le(256)]
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.metadata.get("api", True):
            default = Field(default=f.default) if f.default_factory is MISSING else Field(default_factory=f.default_factory)
            out[f.name] = (hints[f.name], default)
    return out


if TYPE_CHECKING:  # mypy cannot run create_model: it reads the fields' types off the dataclass (read only
    # those: it also sees use_cache, guide and to_dict, which the spec has not)
    class _Fields(BaseModel, DecodeParams):
        ...
else:
    _Fields = create_model("DecodeParamsFields", **_fields_of(DecodeParams))


class ParamsSpec(_Fields):
    """model.params.DecodeParams, as JSON (the worker builds the real one from it).  Strict: a
    number is a JSON number ("4" is refused, not read as 4), a flag a JSON boolean."""

    # the worker: DecodeParams(**spec.model_dump()); a refusal names the field (the API's 422 bad_input)
    model_config = ConfigDict(extra="forbid", strict=True)


def tuned(**values: Any) -> Any:
    """A ParamsSpec default for a workflow: the setting benchmarked best for its task
    (docs/BENCHMARKS.md, the quality section).  Params that give some fields keep these values
    for the others (Tuned); the schema says so (its ParamsSpec shows ParamsSpec's own)."""
    told = ", ".join(f"{k} {v}" for k, v in values.items())
    return Field(default_factory=lambda: ParamsSpec(**values),
                 description=f"decode parameters; a field left out takes this kind's default ({told}), or ParamsSpec's")


class Tuned(BaseModel):
    """A spec whose ParamsSpec fields have its workflow's defaults: `{"max_new_tokens": 200}`
    changes that field only, the policy, window and tau stay the workflow's (not ParamsSpec's)."""

    @model_validator(mode="before")
    @classmethod
    def _overlay(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, f in cls.model_fields.items():
            given = data.get(name)
            if isinstance(given, dict) and f.annotation is ParamsSpec and f.default_factory is not None:
                tuned = f.default_factory()  # type: ignore[call-arg]
                out[name] = {**tuned.model_dump(exclude_defaults=True), **given}
        return out
