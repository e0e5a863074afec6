"""A tenant's SQL quotas at the API (runtime/sessions/quota.py): past tenant_max_sessions or
tenant_max_turn_bytes, creating a session, forking one, opening a conversation or submitting a
job is 409 over_budget naming the setting, and changes nothing; another tenant is unaffected."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.runtime.api.conftest import ACME, GLOBEX, NARRATIVE, Api


def _refused(r: httpx.Response, setting: str) -> None:
    body = r.json()
    assert r.status_code == 409 and body["error"]["code"] == "over_budget" and setting in body["error"]["message"], body


def test_past_its_sessions_a_tenant_opens_none_and_nothing_changes(make_api: Callable[..., Api]) -> None:
    api = make_api(tenant_max_sessions=3)
    sid = api.seed_session("acme", turns=1)
    assert api.http.post("/v1/sessions", headers=ACME).status_code == 201
    assert api.http.post(f"/v1/sessions/{sid}/fork", headers=ACME, json={"turn": 0}).status_code == 201
    before = api.snapshot()
    _refused(api.http.post("/v1/sessions", headers=ACME), "tenant_max_sessions")
    _refused(api.http.post(f"/v1/sessions/{sid}/fork", headers=ACME, json={"turn": 0}), "tenant_max_sessions")
    _refused(api.http.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE}),
             "tenant_max_sessions")
    _refused(api.http.post("/v1/conversations", headers=ACME, json={}), "tenant_max_sessions")
    assert api.snapshot() == before
    assert api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json={"text": "hi"}).status_code == 202
    assert api.http.post("/v1/sessions", headers=GLOBEX).status_code == 201


def test_a_fork_loop_stops_at_the_turn_bytes_quota(make_api: Callable[..., Api]) -> None:
    probe = make_api()
    sid = probe.seed_session("acme", turns=2)
    size = sum(t.bytes for t in probe.svc.records.turns(sid, "acme"))
    api = make_api(tenant_max_turn_bytes=3 * size)
    sid = api.seed_session("acme", turns=2)
    codes = [api.http.post(f"/v1/sessions/{sid}/fork", headers=ACME, json={"turn": 1}).status_code
             for _ in range(5)]
    assert codes == [201, 201, 409, 409, 409]
    before = api.snapshot()
    r = api.http.post(f"/v1/sessions/{sid}/fork", headers=ACME, json={"turn": 1})
    _refused(r, "tenant_max_turn_bytes")
    _refused(api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json={"text": "hi"}), "tenant_max_turn_bytes")
    assert api.snapshot() == before
    assert api.http.post(f"/v1/sessions/{sid}/fork", headers=GLOBEX, json={"turn": 1}).status_code == 404
