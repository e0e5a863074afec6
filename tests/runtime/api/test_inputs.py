"""Inputs the API's schema accepts that were once taken wrongly (found by probing the whole
input space): each is refused with its code and changes nothing, or is taken as sent."""

from __future__ import annotations

import copy
import json
import unicodedata
from typing import Any

import pytest
from pydantic import BaseModel

from domain.grammar import valid
from domain.payload import METRIC, Breakdown, Metric, Payload
from runtime.jobs.params import ParamsSpec
from runtime.jobs.specs import AgentSpec, InfillSpec, NarrativeSpec, ReportSpec, TurnSpec
from tests.runtime.api.conftest import ACME, DATA, Api


def _refused(api: Api, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    before = api.snapshot()
    r = api.http.request(method, path, headers={**ACME, **kwargs.pop("headers", {})}, **kwargs)
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_input", r.text
    assert api.snapshot() == before, "a refused request changed state"
    return dict(r.json())


@pytest.mark.parametrize("where", ["value", "prev", "target", "row name", "row value"])
def test_a_payload_field_with_a_trailing_newline_is_refused(api: Api, where: str) -> None:
    """Python's `$` also matches before a final newline: the checks are whole-string matches."""
    data = copy.deepcopy(DATA)
    if where in ("value", "prev", "target"):
        data["metrics"][0][where] += "\n"
    elif where == "row name":
        data["breakdown"]["rows"][0][0] += "\n"
    else:
        data["breakdown"]["rows"][0][1] += "\n"
    _refused(api, "POST", "/v1/jobs", json={"kind": "narrative", "spec": {"payload": data}})


@pytest.mark.parametrize("field", ["metric", "region", "period", "value"])
def test_a_dataset_field_with_a_trailing_newline_is_refused(api: Api, field: str) -> None:
    row = {"metric": "churn", "region": "APAC", "period": "2026-Q3", "value": "2.7"}
    row[field] += "\n"
    _refused(api, "PUT", "/v1/datasets/x", json={"rows": [row]})


def test_a_csv_with_a_byte_order_mark_is_read(api: Api) -> None:
    """Excel's "CSV UTF-8" starts with a BOM: it is no part of the header."""
    body = "\ufeffmetric,region,period,value\nchurn,APAC,2026-Q3,2.4\n".encode()
    r = api.http.put("/v1/datasets/x", content=body, headers={**ACME, "Content-Type": "text/csv"})
    assert r.status_code == 200 and r.json()["rows"] == 1, r.text
    assert api.http.get("/v1/datasets/x", headers=ACME).json()["data"] == [["churn", "APAC", "2026-Q3", "2.4"]]


@pytest.mark.parametrize("after", ["\u0661-\u0661", "\uff11-\uff11", "1-\u0661"])
def test_an_event_id_of_non_ascii_digits_is_refused(api: Api, after: str) -> None:
    """`\\d` takes any Unicode digit, and Redis refuses them as a stream id: the stream then
    read nothing but its end."""
    jid = api.http.post("/v1/jobs", json={"kind": "turn", "spec": {"text": "Hi."}}, headers=ACME).json()["id"]
    _refused(api, "GET", f"/v1/jobs/{jid}/events", params={"after": after})


@pytest.mark.parametrize("route", ["turns", "infill"])
def test_an_explicit_null_tau_is_kept_on_the_session_routes(api: Api, route: str) -> None:
    """tau null (commit only the window's own schedule) reached the worker as the default 0.9:
    the session routes dropped every null they were sent."""
    sid = api.http.post("/v1/sessions", headers=ACME).json()["id"]
    text = "Hi." if route == "turns" else "Hi <hole>."
    r = api.http.post(f"/v1/sessions/{sid}/{route}", json={"text": text, "params": {"tau": None, "window": 8}},
                      headers=ACME)
    assert r.status_code == 202, r.text
    spec = api.svc.jobs.get(r.json()["id"], "acme").spec
    assert spec["params"]["tau"] is None and spec["params"]["window"] == 8
    assert "input_ids" not in spec, "what was not sent is not stored"


@pytest.mark.parametrize("spec_cls, given, want", [
    (NarrativeSpec, {"payload": DATA}, {"policy": "prefix", "window": 8, "tau": 0.99}),
    (AgentSpec, {"question": "What was the churn?"}, {"policy": "prefix", "window": 4, "tau": 0.9}),
    (InfillSpec, {"text": "a <hole> b"}, {"policy": "set", "window": 8, "tau": 0.7}),
    (ReportSpec, {"title": "Q3", "data": DATA, "outline": [{"title": "Revenue", "metrics": ["revenue"]}]},
     {"policy": "prefix", "window": 8, "tau": 0.99})])
def test_params_that_give_some_fields_keep_the_workflows_defaults_for_the_others(
        spec_cls: Any, given: dict[str, Any], want: dict[str, Any]) -> None:
    spec = spec_cls.model_validate({**given, "params": {"max_new_tokens": 24}})
    assert spec.params.max_new_tokens == 24
    assert {k: getattr(spec.params, k) for k in want} == want
    assert spec_cls.model_validate({**given, "params": {"tau": None}}).params.tau is None  # given: kept
    assert spec_cls.model_validate(given).params == spec_cls.model_validate({**given, "params": {}}).params


@pytest.mark.parametrize("kind, spec", [("narrative", {"payload": DATA, "params": {"max_new_tokens": 24}}),
                                        ("turn", {"text": "Hi.", "params": {"tau": None}}),
                                        ("infill", {"text": "Hi <hole>."})])
def test_a_job_is_stored_with_its_params_whole(api: Api, kind: str, spec: dict[str, Any]) -> None:
    """What a job's params mean is fixed when it is accepted: a retry, or a worker of another
    version with other defaults, reads the same."""
    body: dict[str, Any] = {"kind": kind, "spec": spec}
    if kind != "narrative":
        body["session"] = api.http.post("/v1/sessions", headers=ACME).json()["id"]
    r = api.http.post("/v1/jobs", json=body, headers=ACME)
    assert r.status_code == 202, r.text
    stored = api.svc.jobs.get(r.json()["id"], "acme").spec
    models: dict[str, type[BaseModel]] = {"narrative": NarrativeSpec, "turn": TurnSpec, "infill": InfillSpec}
    model = models[kind]
    parsed = model.model_validate(spec)
    assert stored["params"] == parsed.params.model_dump()  # type: ignore[attr-defined]
    assert set(stored["params"]) == set(ParamsSpec.model_fields)


# ---- the payload's grammar: business data as it comes (domain/narrative.py, runtime/jobs/specs.py) ----

ROWS = ["Müller & Söhne GmbH", "株式会社ヤマダ", "الرياض", "Ελλάδα", "서울 (본사)", "São Paulo | SP",
        "O'Brien \"Nord\" <B2B>", "Zürich 2"]
WORLD: dict[str, Any] = {  # every kind of name, decomposed where it has accents; JSON numbers and strings
    "tenant": unicodedata.normalize("NFD", "Ünïcødé Holding | 東京 (JP)"), "period": "2026年 第3四半期", "style": "brief",
    "metrics": [{"key": "revenue", "value": -1240.5, "prev": "123456789012345", "target": "-0.000001"},
                {"name": unicodedata.normalize("NFD", "Umsatz pro Kunde"), "unit": "€/Kunde", "value": 980,
                 "prev": 1020.5},
                {"name": "売上高", "unit": "百万円", "value": "-12.5", "prev": -12.25, "target": 0},
                {"name": "é" * 80, "unit": "ر.س", "value": "0.000001", "prev": "2.50"}],
    "breakdown": {"kind": "segment", "metric": "Umsatz pro Kunde",
                  "rows": [[unicodedata.normalize("NFD", n), i * 10 - 30, str(i * 7)] for i, n in enumerate(ROWS)]}}
WORLD_PAYLOAD = Payload(
    "Ünïcødé Holding | 東京 (JP)", "2026年 第3四半期", "brief",
    [Metric("revenue", "-1240.5", "123456789012345", "-0.000001"),
     Metric("Umsatz pro Kunde", "980", "1020.5", custom_unit="€/Kunde"),
     Metric("売上高", "-12.5", "-12.25", "0", custom_unit="百万円"),
     Metric("é" * 80, "0.000001", "2.50", custom_unit="ر.س")],
    Breakdown("segment", "Umsatz pro Kunde", [(n, str(i * 10 - 30), str(i * 7)) for i, n in enumerate(ROWS)]))


def test_a_payload_of_any_names_and_json_numbers_is_taken_as_sent(api: Api) -> None:
    """Names in any script, with signs, of 80 characters, sent decomposed; numbers as JSON numbers
    or strings, negative ones: accepted, and read by the worker (which parses the stored spec)
    as given, in NFC."""
    assert valid(WORLD_PAYLOAD) is None
    r = api.http.post("/v1/jobs", json={"kind": "narrative", "spec": {"payload": WORLD}}, headers=ACME)
    assert r.status_code == 202, r.text
    stored = api.svc.jobs.get(r.json()["id"], "acme").spec
    assert NarrativeSpec.model_validate(stored).payload.to_payload() == WORLD_PAYLOAD
    # (the key figures left out: the shipped model reads the names as text, and 80 é are 160 tokens of it)
    report = {"title": "Rapport T3 | <Nord>", "data": WORLD, "summary": False, "outline": [
        {"title": "売上 & 利益 (Q3)", "metrics": ["Umsatz pro Kunde", "売上高"]}, {"title": "é" * 80, "metrics": ["é" * 80]}]}
    r = api.http.post("/v1/jobs", json={"kind": "report", "spec": report}, headers=ACME)
    assert r.status_code == 202, r.text
    parsed = ReportSpec.model_validate(api.svc.jobs.get(r.json()["id"], "acme").spec)
    assert parsed.data.to_payload() == WORLD_PAYLOAD and [s.title for s in parsed.outline] == ["売上 & 利益 (Q3)", "é" * 80]


def _with(**change: Any) -> dict[str, Any]:
    """WORLD with one change: a field of the first metric (metric=...), the first row (row=...),
    or a field of the payload."""
    data = copy.deepcopy(WORLD)
    if "metric" in change:
        data["metrics"][0].update(change.pop("metric"))
    if "row" in change:
        data["breakdown"]["rows"][0] = change.pop("row")
    return {**data, **change}


OUTSIDE: list[tuple[str, dict[str, Any], str]] = [
    ("a name of 81 characters", _with(tenant="x" * 81), "tenant: Value error, a name is 1-80 characters, got 81"),
    ("a control character", _with(row=["EM\u0007EA", 1, 2]), "U+0007"),
    ("a line break in a unit", _with(metrics=[{"name": "NPS", "unit": "pts\n", "value": 1, "prev": 2}], breakdown=None),
     "U+000A"),
    ("a control token", _with(period="[BOS]Q3"), "[BOS] is a control token"),
    ("a thousands separator", _with(metric={"value": "1,240"}),
     "'1,240' has a thousands separator: write it without one, with a point for decimals, like 1240"),
    ("16 significant digits", _with(metric={"prev": "1234567890123456"}), "at most 15 significant digits, got 16"),
    ("7 decimals", _with(metric={"target": -0.0000001}), "at most 6 decimals, got 7"),
    ("9 metrics", _with(metrics=[{"key": k, "value": 1, "prev": 2} for k in list(METRIC)[:9]], breakdown=None),
     "metrics: List should have at most 8 items"),
    ("13 rows", _with(breakdown={"kind": "region", "metric": "revenue", "rows": [[f"R{i}", 1, 2] for i in range(13)]}),
     "breakdown.rows: List should have at most 12 items"),
    ("true", _with(metric={"value": True}), "a number is a JSON number or a string"),
    ("two rows named alike", _with(row=["Zürich 2", 1, 2]), "named twice: ['Zürich 2']"),
]


@pytest.mark.parametrize("payload, why", [(p, w) for _, p, w in OUTSIDE], ids=[o[0] for o in OUTSIDE])
def test_a_payload_outside_the_grammar_is_refused_saying_why_and_changes_nothing(api: Api, payload: dict[str, Any],
                                                                                 why: str) -> None:
    for kind, spec in (("narrative", {"payload": payload}),
                       ("report", {"title": "Q3", "data": payload, "outline": [{"title": "T", "metrics": ["revenue"]}]})):
        body = _refused(api, "POST", "/v1/jobs", json={"kind": kind, "spec": spec})
        assert why in body["error"]["message"], body


def test_a_nan_number_is_refused(api: Api) -> None:
    """Python's JSON reader takes NaN and Infinity, which JSON has not: no number."""
    text = json.dumps({"kind": "narrative", "spec": {"payload": _with(metric={"value": "@"})}}).replace('"@"', "NaN")
    body = _refused(api, "POST", "/v1/jobs", content=text, headers={"Content-Type": "application/json"})
    assert "a number is finite, got nan" in body["error"]["message"]


@pytest.mark.parametrize("setflow", [{"window": "4"}, {"tau": "0.9"}, {"seed": 1.0}, {"ignore_eos": 1},
                                     {"policy": "fast"}, {"window": 0}])
def test_the_responses_extension_takes_numbers_as_numbers(api: Api, setflow: dict[str, Any]) -> None:
    """The Responses API's setflow parameters are as strict as a job's (ParamsSpec): a string
    is not read as a number, nor 1 as true."""
    before = api.snapshot()
    r = api.http.post("/v1/responses", json={"model": "setflow", "input": "Hello.", "setflow": setflow}, headers=ACME)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert api.snapshot() == before

