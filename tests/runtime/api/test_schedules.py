"""/v1/schedules on a real Redis and SQLite (no worker): create, list (each with its next runs
in its time zone), read (with its ticks), pause, resume, delete; another tenant's schedule does
not exist; a bad cron, time zone, spec or dataset is a 422 that writes nothing; the cap is a
409.  And a tick of the workers' ticker (here: called) submits the schedule's jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from runtime.jobs.datasets import parse_json
from runtime.schedules import templates
from runtime.schedules.ticker import Ticker
from tests.runtime.api.conftest import ACME, GLOBEX, NARRATIVE, REPORT, Api

SALES = {"rows": [{"metric": m, "region": r, "period": p, "value": v}
                  for r, base in (("EMEA", 500), ("APAC", 300))
                  for m, scale in (("revenue", 1), ("orders", 10))
                  for p, v in (("2026-Q2", base * scale), ("2026-Q3", (base + 20) * scale))]}
PER_REGION: dict[str, Any] = {
    "name": "weekly per region", "cron": "0 7 * * 1", "timezone": "Europe/Berlin",
    "template": {"kind": "report", "spec": {"title": "Weekly", "outline": [{"title": "Revenue", "metrics": ["revenue"]},
                                                                          {"title": "Orders", "metrics": ["orders"]}]}},
    "data": {"dataset": "sales", "per": "region"}}


def _create(api: Api, body: dict[str, Any], who: dict[str, str] = ACME) -> dict[str, Any]:
    r = api.http.post("/v1/schedules", json=body, headers=who)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def test_create_list_get_pause_resume_delete(api: Api) -> None:
    h = api.http
    assert h.put("/v1/datasets/sales", json=SALES, headers=ACME).status_code == 200
    made = _create(api, PER_REGION)
    assert made["id"].startswith("sch_") and made["paused"] is False and made["missed"] == "skip"
    assert made["template"] == PER_REGION["template"] and made["data"] == {"dataset": "sales", "per": "region"}
    runs = [datetime.fromisoformat(t) for t in made["next_runs"]]
    assert len(runs) == 3 and all(t.weekday() == 0 and (t.hour, t.minute) == (7, 0) for t in runs)
    assert [(b - a).days for a, b in zip(runs, runs[1:])] == [7, 7]
    inline = _create(api, {"cron": "@daily", "template": {"kind": "narrative", "spec": NARRATIVE},
                           "missed": "catch_up", "max_catch_up": 3})
    assert inline["timezone"] == "UTC" and inline["data"] is None
    listed = h.get("/v1/schedules", headers=ACME).json()["schedules"]
    assert [s["id"] for s in listed] == [made["id"], inline["id"]]
    assert h.get("/v1/schedules", headers=GLOBEX).json()["schedules"] == []
    paused = h.post(f"/v1/schedules/{made['id']}/pause", headers=ACME).json()
    assert paused["paused"] is True and paused["next_runs"] == []
    resumed = h.post(f"/v1/schedules/{made['id']}/resume", headers=ACME).json()
    assert resumed["paused"] is False and resumed["next_runs"] == made["next_runs"]
    got = h.get(f"/v1/schedules/{made['id']}", headers=ACME).json()
    assert got["ticks"] == [] and got["name"] == "weekly per region"
    for method, path in (("GET", ""), ("POST", "/pause"), ("POST", "/resume"), ("DELETE", "")):  # another tenant's
        r = h.request(method, f"/v1/schedules/{made['id']}{path}", headers=GLOBEX)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", (method, path)
    assert h.get("/v1/schedules/sch_nope", headers=ACME).status_code == 422
    assert h.delete(f"/v1/schedules/{made['id']}", headers=ACME).status_code == 204
    assert h.get(f"/v1/schedules/{made['id']}", headers=ACME).status_code == 404
    assert h.delete(f"/v1/schedules/{made['id']}", headers=ACME).status_code == 404


def test_a_bad_schedule_is_a_422_that_writes_nothing(api: Api) -> None:
    h = api.http
    assert h.put("/v1/datasets/sales", json=SALES, headers=ACME).status_code == 200
    bad = [{"cron": "0 7 * *"}, {"cron": "* * * * * *"}, {"cron": "0 0 31 2 *"}, {"cron": "H 7 * * *"},
           {"timezone": "Mars/Olympus"}, {"timezone": "../etc"},
           {"template": {"kind": "report", "spec": {"title": "Weekly", "outline": [{"title": "X", "metrics": ["churn"]}]}}},
           {"template": {"kind": "agent", "spec": {"question": "What?"}}},
           {"template": {"kind": "narrative", "spec": {"payload": NARRATIVE["payload"]}}},  # its numbers twice
           {"data": {"dataset": "nothing", "per": "region"}}, {"data": {"dataset": "sales"}},  # two regions: which?
           {"data": {"dataset": "sales", "per": "customer"}}, {"missed": "later"}, {"max_catch_up": 1000},
           {"bogus": 1}]
    before = api.snapshot()
    for change in bad:
        r = h.post("/v1/schedules", json={**PER_REGION, **change}, headers=ACME)
        assert r.status_code == 422, (change, r.text)
        assert r.json()["error"]["code"] == "bad_input"
    assert api.snapshot() == before
    r = h.post("/v1/schedules", json={**PER_REGION, "data": {"dataset": "sales"}}, headers=ACME)
    assert "2 regions" in r.json()["error"]["message"]


def test_the_cap_is_a_409(make_api: Any) -> None:
    api = make_api(tenant_max_schedules=2)
    body = {"cron": "@hourly", "template": {"kind": "report", "spec": REPORT}}
    _create(api, body)
    _create(api, body)
    before = api.snapshot()
    r = api.http.post("/v1/schedules", json=body, headers=ACME)
    assert r.status_code == 409 and r.json()["error"]["code"] == "over_budget"
    assert api.snapshot() == before
    _create(api, body, GLOBEX)  # another tenant's count


def test_create_takes_a_token_and_refuses_a_template_past_the_cap_before_building_it(
        make_api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue #48: each such POST built every region's payload (17.6 s over 5000 regions) and took
    # no token, so a tenant could send them back to back
    api = make_api(tenant_burst=3, tenant_rate_per_s=0.01)
    many = [{"metric": "revenue", "region": f"R{i:03d}", "period": p, "value": "1"}
            for i in range(templates.MAX_JOBS + 10) for p in ("2026-Q2", "2026-Q3")]
    api.svc.datasets.put("acme", "many", parse_json({"rows": many}))  # behind the API: no token
    built: list[str] = []
    monkeypatch.setattr(templates, "payload", lambda rows, source, tenant: built.append(tenant))
    before = api.snapshot()
    body = {**PER_REGION, "data": {"dataset": "many", "per": "region"}}
    for _ in range(3):
        r = api.http.post("/v1/schedules", json=body, headers=ACME)
        assert r.status_code == 422 and r.json()["error"]["code"] == "bad_input", r.text
        assert "60 regions, at most 50 jobs a tick" in r.json()["error"]["message"]
    assert built == []  # refused before any payload was built
    r = api.http.post("/v1/schedules", json={"cron": "@daily", "template": {"kind": "report", "spec": REPORT}}, headers=ACME)
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"  # the refused ones took their tokens
    assert api.snapshot() == before


def test_a_tick_submits_one_report_per_region_and_the_schedule_shows_it(api: Api) -> None:
    h = api.http
    assert h.put("/v1/datasets/sales", json=SALES, headers=ACME).status_code == 200
    made = _create(api, PER_REGION)
    tick = datetime.fromisoformat(made["next_runs"][0]).timestamp()
    ticker = Ticker(api.svc.dispatcher, clock=lambda: tick + 1.5)
    assert ticker.step()["submitted"] == 1
    got = h.get(f"/v1/schedules/{made['id']}", headers=ACME).json()
    [t] = got["ticks"]
    assert (datetime.fromisoformat(t["tick"]).timestamp(), t["status"], t["late_s"], t["error"]) == (tick, "submitted", 1.5, "")
    assert got["next_runs"][0] == made["next_runs"][1]
    views = [h.get(f"/v1/jobs/{i}", headers=ACME).json() for i in t["jobs"]]
    assert {(j["kind"], j["priority"], j["status"]) for j in views} == {("report", "batch", "queued")}
    assert {(j["schedule"], datetime.fromisoformat(j["tick_at"]).timestamp()) for j in views} == {(made["id"], tick)}
    specs = {s["data"]["tenant"]: s for s in (api.svc.jobs.get(i).spec for i in t["jobs"])}
    assert sorted(specs) == ["APAC", "EMEA"]
    assert specs["EMEA"]["data"]["metrics"] == [{"key": "revenue", "value": "520", "prev": "500"},
                                                {"key": "orders", "value": "5200", "prev": "5000"}]
    assert specs["EMEA"]["outline"] == PER_REGION["template"]["spec"]["outline"]
