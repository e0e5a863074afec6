"""A job that cannot fit the model's context (what the session holds plus what the job appends)
is a 422 at submission, before any state changes: not a job that fails at its fourth section."""

from __future__ import annotations

import copy

from tests.runtime.api.conftest import ACME, REPORT, Api, shipped_card

REGIONS = ("EMEA", "APAC", "AMER", "LATAM", "Nordics", "DACH", "Benelux", "Iberia", "UK", "France", "Italy", "Japan")


def _report(sections: int, max_new_tokens: int, long: bool = False) -> dict[str, object]:
    """`sections` sections of one metric each, or (long) each on revenue and churn over a breakdown of
    12 regions (MAX_ROWS): a section is planned for its own longest body, at most max_new_tokens."""
    spec = copy.deepcopy(REPORT)
    keys = [m["key"] for m in spec["data"]["metrics"]]
    spec["outline"] = [{"title": f"Part {i}", "metrics": ["revenue", "churn"] if long else [keys[i % len(keys)]]}
                       for i in range(sections)]
    if long:
        spec["data"]["breakdown"]["rows"] = [[n, str(300 + 7 * i), str(310 - 3 * i) if i % 2 else str(290 + 5 * i)]
                                             for i, n in enumerate(REGIONS)]
    spec["params"] = {"policy": "prefix", "window": 8, "tau": 0.99, "max_new_tokens": max_new_tokens}
    return spec


L = shipped_card().config.max_seq_len  # 2048: 6 short sections fit, 5 that write 12 breakdown rows each do not


def test_a_report_that_cannot_fit_is_refused_before_it_runs(api: Api) -> None:
    ok = api.http.post("/v1/jobs", headers=ACME, json={"kind": "report", "spec": _report(6, 400)})
    assert ok.status_code == 202, ok.text  # six short sections: each planned for its own (short) body
    ok = api.http.post("/v1/jobs", headers=ACME, json={"kind": "report", "spec": _report(4, 400, long=True)})
    assert ok.status_code == 202, ok.text  # four sections writing 12 rows each: 1833 positions
    before = api.snapshot(rate_limits=True)
    r = api.http.post("/v1/jobs", headers=ACME, json={"kind": "report", "spec": _report(5, 400, long=True)})
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_input"
    assert "context_overflow" in r.json()["error"]["message"] and f"of {L} left" in r.json()["error"]["message"]
    assert "needs up to 2258 positions" in r.json()["error"]["message"]  # five: 425 more than four
    assert api.snapshot(rate_limits=True) == before  # no job, no session, no token


def test_a_turn_counts_what_its_session_holds_already(api: Api) -> None:
    sid = api.seed_session("acme", turns=2)
    used = api.svc.records.length(sid, "acme")
    too_long = {"text": "revenue: up\n", "params": {"max_new_tokens": L - used}}
    r = api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json=too_long)
    assert r.status_code == 422 and f"has {L - used} of {L} left" in r.json()["error"]["message"]
    fits = {"text": "revenue: up\n", "params": {"max_new_tokens": L - used - 8}}
    assert api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json=fits).status_code == 202


def test_jobs_queued_on_the_session_count_too(api: Api) -> None:
    sid = api.seed_session("acme", turns=1)
    half = {"text": "revenue: up\n", "params": {"max_new_tokens": (L - api.svc.records.length(sid, "acme")) // 2}}
    assert api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json=half).status_code == 202  # queued
    assert api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json=half).status_code == 422  # it would not fit
