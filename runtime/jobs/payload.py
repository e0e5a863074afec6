"""The dashboard payload (what a narrative or a report section is written from) and the names
and numbers it is written in, as a client sends them: the API's grammar (domain/grammar.py).
No torch: the API process imports this."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from domain.facts import SLOT  # plain Python: a fact slot's text, no torch
from domain.grammar import MAX_DECIMALS, MAX_DIGITS, MAX_METRICS, MAX_NAME, MAX_ROWS, clean_name, name_problem, number_text, valid
from domain.markup import MARKUP_TOKENS, SPECIAL_TOKENS  # plain Python: text that encodes to a control token
from domain.payload import METRIC, Breakdown, Metric, Payload

# ---- names and numbers: the API's grammar (domain/grammar.py), as a client sends them ----------

def name_text(v: str) -> str:
    """A name as the runtime passes it on: NFC, no spaces at its ends, none doubled
    (clean_name); ValueError saying why it is none (name_problem: 1-MAX_NAME
    characters, no control character).  A name enters setflow's models as a slot, never as
    text, but a model that reads facts as text (an imported one: Profile.facts "text") reads
    it, so it spells no control token, markup or fact slot either."""
    name = clean_name(v)
    if not name.strip():  # spaces of any kind: U+0020 are dropped, others (U+00A0, U+3000) kept
        raise ValueError(f"a name has more than spaces, got {v!r}")
    why = name_problem(name)
    if why is not None:
        raise ValueError(why)
    for token in (*SPECIAL_TOKENS, *MARKUP_TOKENS):
        if token in name:
            raise ValueError(f"{token} is a control token of the model, not text: a name does not hold it")
    slot = SLOT.search(name)
    if slot is not None:
        raise ValueError(f"{slot[0]} is a fact slot of the model, not text: a name does not hold it")
    return name


#: a name: any text of 1-80 characters in any script (tenants, metrics, units, periods, rows, titles)
Name = Annotated[str, AfterValidator(name_text), WithJsonSchema({
    "type": "string", "minLength": 1, "maxLength": MAX_NAME,
    "description": f"any text of 1-{MAX_NAME} characters without control characters; passed on in "
                   "NFC, without spaces at its ends or doubled"})]
#: a number: a JSON number or a string of one (number_text), passed on as a string
Number = Annotated[str, BeforeValidator(number_text), WithJsonSchema({
    "anyOf": [{"type": "string"}, {"type": "number"}],
    "description": f"a JSON number or a string like \"-1240.5\": at most {MAX_DIGITS} significant digits "
                   f"and {MAX_DECIMALS} decimals, no thousands separator; passed on as a string"})]

# ---- the dashboard payload (narratives and reports) -------------------------------------------

class MetricSpec(BaseModel):
    """A built-in metric by its `key`, or a dashboard's own by its display `name` and `unit`."""

    model_config = ConfigDict(extra="forbid")
    key: Literal[tuple(METRIC)] | None = None  # type: ignore[valid-type]
    name: Name | None = None
    unit: Name | None = None
    value: Number
    prev: Number
    target: Number | None = None

    @model_validator(mode="after")
    def _builtin_or_custom(self) -> MetricSpec:
        if (self.key is None) == (self.name is None) or (self.name is None) != (self.unit is None):
            raise ValueError("a metric is a built-in `key`, or a custom `name` with its `unit`")
        return self

    @property
    def label(self) -> str:
        """How a breakdown or a report section names it: its key, or a custom metric's name."""
        return self.key if self.key is not None else str(self.name)

    def to_metric(self) -> Metric:
        return Metric(self.label, self.value, self.prev, self.target, custom_unit=self.unit)


class BreakdownSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["region", "segment"]
    metric: Name  # the key or custom name of one of the payload's metrics
    rows: list[tuple[Name, Number, Number]] = Field(min_length=1, max_length=MAX_ROWS)  # (name, value, prev)


class PayloadSpec(BaseModel):
    """A dashboard's numbers: what a narrative or a report section is written from."""

    model_config = ConfigDict(extra="forbid")
    tenant: Name
    period: Name
    style: Literal["brief", "formal", "casual"] = "formal"
    metrics: list[MetricSpec] = Field(min_length=1, max_length=MAX_METRICS)  # each with an optional target
    breakdown: BreakdownSpec | None = None

    @model_validator(mode="after")
    def _consistent(self) -> PayloadSpec:
        keys = [m.label for m in self.metrics]
        if len(set(keys)) != len(keys):
            raise ValueError("each metric at most once")
        if self.breakdown is not None and self.breakdown.metric not in keys:
            raise ValueError(f"the breakdown's metric {self.breakdown.metric!r} is not among the metrics")
        # the narrative names each metric (by its display name) and each row once: a reader tells
        # its clauses apart by their names
        p = self.to_payload()
        names = p.names()
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"each metric and breakdown row needs a name of its own; named twice: {twice}")
        why = valid(p)  # the spec's rules are the grammar's: never, unless the two drift apart
        if why is not None:
            raise ValueError(f"outside the payload grammar: {why}")
        return self

    def to_payload(self) -> Payload:
        b = self.breakdown
        return Payload(self.tenant, self.period, self.style, [m.to_metric() for m in self.metrics],
                              Breakdown(b.kind, b.metric, [(r[0], r[1], r[2]) for r in b.rows]) if b else None)

    @classmethod
    def of(cls, p: Payload) -> PayloadSpec:
        """The spec of a corpus payload (what a client would send for it)."""
        metrics = [{"key": m.key} if not m.custom else {"name": m.key, "unit": m.unit} for m in p.metrics]
        return cls.model_validate({
            "tenant": p.tenant, "period": p.period, "style": p.style,
            "metrics": [{**k, "value": m.value, "prev": m.prev, "target": m.target} for k, m in zip(metrics, p.metrics)],
            "breakdown": None if p.breakdown is None else {"kind": p.breakdown.kind, "metric": p.breakdown.metric,
                                                           "rows": [list(r) for r in p.breakdown.rows]}})
