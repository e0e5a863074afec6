"""/v1/datasets on a real Redis and SQLite (no worker): a tenant's own tables for the agent's
metric tool, uploaded as JSON or CSV, replaced whole, listed, read, deleted; each bad upload
refused with its reason and nothing written; another tenant's invisible; an agent job naming a
dataset the tenant has not is refused at submission."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest

from runtime.jobs.specs import AgentSpec
from tests.runtime.api.conftest import ACME, AGENT, GLOBEX, Api

ROWS = [{"metric": "revenue", "region": "EMEA", "period": "2026-Q2", "value": "500"},
        {"metric": "revenue", "region": "EMEA", "period": "2026-Q3", "value": "550.5"}]
CSV = "metric,region,period,value\nchurn,APAC,2026-Q3,2.4\nchurn,APAC,2026-Q2,-1\n"


def test_a_dataset_is_uploaded_replaced_listed_read_and_deleted(api: Api) -> None:
    h = api.http
    r = h.put("/v1/datasets/sales", json={"rows": ROWS}, headers=ACME)
    assert r.status_code == 200 and r.json()["rows"] == 2, r.text
    assert h.get("/v1/datasets/sales", headers=ACME).json()["data"] == [
        ["revenue", "EMEA", "2026-Q2", "500"], ["revenue", "EMEA", "2026-Q3", "550.5"]]
    r = h.put("/v1/datasets/sales", content=CSV, headers={**ACME, "Content-Type": "text/csv; charset=utf-8"})
    assert r.status_code == 200 and r.json()["rows"] == 2  # replaced whole
    assert h.get("/v1/datasets/sales", headers=ACME).json()["data"] == [["churn", "APAC", "2026-Q3", "2.4"],
                                                                     ["churn", "APAC", "2026-Q2", "-1"]]
    assert [d["name"] for d in h.get("/v1/datasets", headers=ACME).json()["datasets"]] == ["sales"]
    assert h.get("/v1/datasets", headers=GLOBEX).json()["datasets"] == []
    assert h.get("/v1/datasets/sales", headers=GLOBEX).status_code == 404  # another tenant's: not there
    assert h.delete("/v1/datasets/sales", headers=GLOBEX).status_code == 404
    assert h.delete("/v1/datasets/sales", headers=ACME).status_code == 204
    assert h.get("/v1/datasets/sales", headers=ACME).status_code == 404
    assert h.delete("/v1/datasets/sales", headers=ACME).status_code == 404


BAD: list[tuple[str, dict[str, Any], int, str]] = [
    ("a duplicate key", {"json": {"rows": ROWS + ROWS[:1]}}, 422, "twice"),
    ("a key twice but for spaces", {"json": {"rows": ROWS + [{**ROWS[0], "region": " EMEA  "}]}}, 422, "twice"),
    ("a key twice but for NFC", {"json": {"rows": [{**ROWS[0], "region": "Köln"}, {**ROWS[0], "region": "Ko\u0308ln"}]}},
     422, "twice"),
    ("a name of spaces only", {"json": {"rows": [{**ROWS[0], "region": "   "}]}}, 422, "more than spaces"),
    ("a name of 65 characters", {"json": {"rows": [{**ROWS[0], "metric": "u\u0308" * 65}]}}, 422,
     "1-64 characters (a tool call's argument), got 65"),
    ("a control character", {"json": {"rows": [{**ROWS[0], "period": "2026\u0085Q3"}]}}, 422, "U+0085"),
    ("a control token", {"json": {"rows": [{**ROWS[0], "region": "[EOS]"}]}}, 422, "[EOS] is a control token"),
    ("a value that is no number", {"json": {"rows": [{**ROWS[0], "value": "12k"}]}}, 422, "not a number"),
    ("an exponent", {"json": {"rows": [{**ROWS[0], "value": 1e20}]}}, 422, "15 significant digits, got 21"),
    ("7 decimals", {"json": {"rows": [{**ROWS[0], "value": "0.1234567"}]}}, 422, "6 decimals, got 7"),
    ("a thousands separator", {"json": {"rows": [{**ROWS[0], "value": "1,240.5"}]}}, 422, "like 1240.5"),
    ("a CSV thousands separator", {"content": 'metric,region,period,value\nrev,EMEA,Q3,"1 240"\n',
                                   "headers": {"Content-Type": "text/csv"}}, 422, "thousands separator"),
    ("a boolean value", {"json": {"rows": [{**ROWS[0], "value": True}]}}, 422, "a JSON number or a string"),
    ("a boolean name", {"json": {"rows": [{**ROWS[0], "period": False}]}}, 422, "a metric, region or period is a string"),
    ("a quote in a name", {"json": {"rows": [{**ROWS[0], "region": 'E"MEA'}]}}, 422, 'holds no "'),
    ("markup in a name", {"json": {"rows": [{**ROWS[0], "region": "<b>EMEA"}]}}, 422, "holds no < or >"),
    ("a missing field", {"json": {"rows": [{"metric": "a", "region": "b", "period": "c"}]}}, 422, "exactly the fields"),
    ("no rows", {"json": {"rows": []}}, 422, "1..10000 rows"),
    ("not an object", {"json": [1, 2]}, 422, "a dataset is"),
    ("a CSV without the header", {"content": "revenue,EMEA,2026-Q3,1\n", "headers": {"Content-Type": "text/csv"}},
     422, "header"),
    ("a short CSV row", {"content": "metric,region,period,value\na,b,c\n", "headers": {"Content-Type": "text/csv"}},
     422, "3 fields"),
    ("bytes that are not UTF-8", {"content": b"\xff\xfe", "headers": {"Content-Type": "text/csv"}}, 415, "UTF-8"),
    ("broken JSON", {"content": b"{", "headers": {"Content-Type": "application/json"}}, 422, "not application/json"),
    ("another media type", {"content": b"x", "headers": {"Content-Type": "text/plain"}}, 415, "text/csv"),
]


@pytest.mark.parametrize("what,kwargs,status,reason", BAD, ids=[b[0] for b in BAD])
def test_a_bad_upload_says_why_and_writes_nothing(api: Api, what: str, kwargs: dict[str, Any], status: int,
                                                   reason: str) -> None:
    api.http.put("/v1/datasets/sales", json={"rows": ROWS}, headers=ACME)
    before, rows = api.snapshot(), api.http.get("/v1/datasets/sales", headers=ACME).json()["data"]
    headers = {**ACME, **kwargs.pop("headers", {})}
    r = api.http.put("/v1/datasets/sales", headers=headers, **kwargs)
    assert r.status_code == status and reason in r.json()["error"]["message"], (what, r.text)
    assert api.snapshot() == before and api.http.get("/v1/datasets/sales", headers=ACME).json()["data"] == rows


def test_names_in_any_script_and_json_numbers_are_taken(api: Api) -> None:
    """Names in any script and with signs (but for a quote, < and >), sent decomposed, kept in
    NFC; a value a JSON number or a string, negative too, kept as the string it writes; an agent
    asks about them in its own script."""
    rows = [{"metric": "Umsatz", "region": "Ko\u0308ln (Innenstadt) & Bonn", "period": "Q3/2026", "value": -1240.5},
            {"metric": "売上高", "region": "東京", "period": "2026年第3四半期", "value": 980},
            {"metric": "الإيرادات", "region": "الرياض", "period": 2026, "value": "-0.000001"},
            {"metric": "x" * 64, "region": "São Paulo | SP", "period": "FY26", "value": "123456789012345"}]
    r = api.http.put("/v1/datasets/welt", json={"rows": rows}, headers=ACME)
    assert r.status_code == 200 and r.json()["rows"] == 4, r.text
    assert api.http.get("/v1/datasets/welt", headers=ACME).json()["data"] == [
        ["Umsatz", "Köln (Innenstadt) & Bonn", "Q3/2026", "-1240.5"], ["売上高", "東京", "2026年第3四半期", "980"],
        ["الإيرادات", "الرياض", "2026", "-0.000001"], ["x" * 64, "São Paulo | SP", "FY26", "123456789012345"]]
    for question in ("2026年第3四半期の東京の売上高はいくらでしたか？", "ما هي الإيرادات في الرياض في 2026؟",
                     "Wie hoch war der Umsatz in Ko\u0308ln (Innenstadt) & Bonn im Q3/2026?"):
        r = api.http.post("/v1/jobs", json={"kind": "agent", "spec": {"question": question, "dataset": "welt"}},
                          headers=ACME)
        assert r.status_code == 202, r.text
        stored = api.svc.jobs.get(r.json()["id"], "acme").spec
        assert AgentSpec.model_validate(stored).question == unicodedata.normalize("NFC", question)  # as the worker reads it


def test_an_agent_job_names_a_dataset_its_tenant_has(api: Api) -> None:
    api.http.put("/v1/datasets/sales", json={"rows": ROWS}, headers=ACME)
    before = api.snapshot()
    r = api.http.post("/v1/jobs", json={"kind": "agent", "spec": {**AGENT, "dataset": "nope"}}, headers=ACME)
    assert r.status_code == 404 and "no dataset 'nope'" in r.json()["error"]["message"]
    r = api.http.post("/v1/jobs", json={"kind": "agent", "spec": {**AGENT, "dataset": "sales"}}, headers=GLOBEX)
    assert r.status_code == 404  # acme's dataset is not globex's
    r = api.http.post("/v1/jobs", json={"kind": "agent", "spec": {**AGENT, "dataset": "sales",
                                                                  "client_tools": ["metric"]}}, headers=ACME)
    assert r.status_code == 422 and "runs on the client" in r.json()["error"]["message"]
    assert api.snapshot() == before
    r = api.http.post("/v1/jobs", json={"kind": "agent", "spec": {**AGENT, "dataset": "sales"}}, headers=ACME)
    assert r.status_code == 202, r.text


def test_a_tenant_holds_at_most_its_datasets(make_api: Any) -> None:
    api = make_api(tenant_max_datasets=2)
    for name in ("a", "b"):
        assert api.http.put(f"/v1/datasets/{name}", json={"rows": ROWS}, headers=ACME).status_code == 200
    before = api.snapshot()
    r = api.http.put("/v1/datasets/c", json={"rows": ROWS}, headers=ACME)
    assert r.status_code == 409 and r.json()["error"]["code"] == "over_budget" and "tenant_max_datasets" in r.text
    r = api.http.put("/v1/datasets/c", json={"rows": "not rows"}, headers=ACME)
    assert r.status_code == 409, "refused before its body is parsed (a 10k-row parse is the API's costliest work)"
    assert api.snapshot() == before
    assert api.http.put("/v1/datasets/a", json={"rows": ROWS[:1]}, headers=ACME).status_code == 200  # a replace
    got = api.http.get("/v1/datasets/a", headers=ACME).json()
    assert got["rows"] == len(got["data"]) == 1 and len(ROWS) > 1, "replaced whole"
    assert api.http.put("/v1/datasets/c", json={"rows": ROWS}, headers=GLOBEX).status_code == 200  # its own count


def test_names_are_kept_as_a_question_names_them(api: Api) -> None:
    """Spaces at a name's ends dropped, runs inside made one (domain/grammar.py canonical),
    as an agent's question is: the row is found whichever way the call spaces the name."""
    from workflows import tools

    rows = [{"metric": "net  revenue ", "region": " North  America", "period": "FY27", "value": "12"}]
    assert api.http.put("/v1/datasets/sales", json={"rows": rows}, headers=ACME).status_code == 200
    data = api.http.get("/v1/datasets/sales", headers=ACME).json()["data"]
    assert data == [["net revenue", "North America", "FY27", "12"]]
    table = tools.Table.of("sales", [["net  revenue ", "North America ", "FY27", "12"]])  # a row stored before
    for call in ('metric("net revenue", "North America", "FY27")', 'metric("net revenue ", "North  America", "FY27")'):
        r = tools.run_call(call, table)
        assert r.ok and r.result == "12", r.result
    # two rows stored before names were kept so, one key now: neither answers, the model is told
    table = tools.Table.of("sales", [["rev", "EMEA", "Q1", "1"], ["rev", "EMEA ", "Q1", "2"], ["rev", "APAC", "Q1", "3"]])
    r = tools.run_call('metric("rev", "EMEA", "Q1")', table)
    assert not r.ok and "differ only in spaces" in r.result
    assert tools.run_call('metric("rev", "APAC", "Q1")', table).result == "3"
    asked = tools.client_call('metric("rev ", "North  America", "Q1")', "call_1")
    assert isinstance(asked, dict) and asked["arguments"] == {"metric": "rev", "region": "North America", "period": "Q1"}
