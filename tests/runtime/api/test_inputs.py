"""Inputs the API's schema accepts that were once taken wrongly (found by probing the whole
input space): each is refused with its code and changes nothing, or is taken as sent."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from runtime.jobs.specs import AgentSpec, InfillSpec, NarrativeSpec, ParamsSpec, ReportSpec, TurnSpec
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
    parsed = {"narrative": NarrativeSpec, "turn": TurnSpec, "infill": InfillSpec}[kind].model_validate(spec)
    assert stored["params"] == parsed.params.model_dump()  # type: ignore[attr-defined]
    assert set(stored["params"]) == set(ParamsSpec.model_fields)
