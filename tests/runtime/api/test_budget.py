"""A job that cannot fit the model's context (what the session holds plus what the job appends)
is a 422 at submission, before any state changes: not a job that fails at its fourth section.
The check is costly: it comes after the rate-limit token, and adds up the plans kept with the
jobs ahead on the session rather than planning each of them again."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

import workflows
from runtime.api import services
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
    assert api.snapshot(rate_limits=True) == before  # no job, no session (its token taken: the test below)


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


def test_a_refused_costly_submission_has_paid_its_token(make_api: Callable[..., Api]) -> None:
    api = make_api(tenant_rate_per_s=0.001, tenant_burst=3)
    for _ in range(3):
        r = api.http.post("/v1/jobs", headers=ACME, json={"kind": "report", "spec": _report(5, 400, long=True)})
        assert r.status_code == 422 and "context_overflow" in r.text
    r = api.http.post("/v1/jobs", headers=ACME, json={"kind": "report", "spec": _report(1, 400)})
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"


def test_a_submission_adds_up_the_plans_kept_with_the_jobs_ahead(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    sid = api.seed_session("acme", turns=1)
    turn = {"text": "revenue: up\n", "params": {"max_new_tokens": 16}}
    planned: list[str] = []

    def counting(kind: str, spec: Any, *args: Any) -> int:
        planned.append(kind)
        return real(kind, spec, *args)

    real = workflows.positions
    monkeypatch.setattr(workflows, "positions", counting)
    monkeypatch.setattr(services, "positions", counting)
    for _ in range(5):
        assert api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json=turn).status_code == 202
    assert len(planned) == 5, "each job planned once, at its submission"
    kept = [n for _, n in api.svc.jobs.planned(sid)]
    assert kept == [kept[0]] * 5 and kept[0] > 16
    api.svc.dispatcher.submit("turn", "acme", turn, sid)  # not through the API: no plan kept with it
    planned.clear()
    assert api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json=turn).status_code == 202
    assert planned == ["turn", "turn"], "the new job's plan, and the one job ahead that had none"
    left = L - api.svc.records.length(sid, "acme") - 7 * kept[0]
    too_long = {"text": "revenue: up\n", "params": {"max_new_tokens": left - kept[0] + 16 + 1}}
    r = api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json=too_long)
    assert r.status_code == 422 and f"has {left} of {L} left" in r.json()["error"]["message"]
