"""The API's boundaries, route by route: tenant isolation (another tenant's session or job is a
404 not_found everywhere, and is never listed), API keys (401 unauthorized on every route but
the public ones), request validation (422 bad_input naming the field; 413 past max_body_bytes)
and the per-tenant rate limit (429 rate_limited with Retry-After).  Every refusal is checked to
leave the state as it was."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from runtime.jobs.kinds import check_spec
from tests.runtime.api.conftest import ACME, AGENT, GLOBEX, INFILL, NARRATIVE, REPORT, TURN, Api

PUBLIC = {("GET", "/healthz"), ("GET", "/metrics"), ("GET", "/"), ("GET", "/openapi.json")}
NO_JOB = "0123456789abcdef01234567"  # a well-formed job id that nobody has
NO_SESSION = "no-such-session"


def error(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    body: dict[str, Any] = r.json()["error"]
    assert body["code"] == code, body
    assert body["message"]
    return body


def test_sample_specs_are_valid() -> None:
    for kind, spec in (("narrative", NARRATIVE), ("agent", AGENT), ("report", REPORT), ("turn", TURN),
                       ("infill", INFILL)):
        check_spec(kind, spec, "s")


# ---- tenant isolation ---------------------------------------------------------------------------

class World:
    """acme's session (one turn, a queued turn job on it) and a narrative job on a new session."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.session = api.seed_session("acme", turns=1)
        r = api.http.post(f"/v1/sessions/{self.session}/turns", headers=ACME, json=TURN)
        assert r.status_code == 202, r.text
        self.turn_job = r.json()["id"]
        r = api.http.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE})
        assert r.status_code == 202, r.text
        self.narrative_job, self.narrative_session = r.json()["id"], r.json()["session"]
        r = api.http.post("/v1/sessions", headers=ACME)
        assert r.status_code == 201, r.text
        self.empty_session = r.json()["id"]


@pytest.fixture
def world(api: Api) -> World:
    return World(api)


def calls_on(sessions: list[str], jobs: list[str]) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every route that names a session or a job, with a valid request otherwise."""
    out: list[tuple[str, str, dict[str, Any] | None]] = []
    for sid in sessions:
        out += [("GET", f"/v1/sessions/{sid}", None),
                ("DELETE", f"/v1/sessions/{sid}", None),
                ("POST", f"/v1/sessions/{sid}/turns", TURN),
                ("POST", f"/v1/sessions/{sid}/infill", INFILL),
                ("POST", f"/v1/sessions/{sid}/fork", {"turn": 0}),
                ("POST", "/v1/jobs", {"kind": "turn", "spec": TURN, "session": sid}),
                ("POST", "/v1/jobs", {"kind": "agent", "spec": AGENT, "session": sid})]
    for jid in jobs:
        out += [("GET", f"/v1/jobs/{jid}", None),
                ("POST", f"/v1/jobs/{jid}/cancel", None),
                ("GET", f"/v1/jobs/{jid}/events", None),
                ("POST", f"/v1/jobs/{jid}/tool_outputs", {"tool_outputs": [{"call_id": "call_1", "output": "1"}]})]
    return out


def test_another_tenants_sessions_and_jobs_do_not_exist(world: World) -> None:
    api = world.api
    before = api.snapshot(rate_limits=True)  # not even a rate-limit token is taken by a 404
    acme_view = api.http.get(f"/v1/sessions/{world.session}", headers=ACME).json()
    sessions = [world.session, world.narrative_session, world.empty_session]
    jobs = [world.turn_job, world.narrative_job]
    real = calls_on(sessions, jobs)
    nobodys = calls_on([f"nobody-{i}" for i in range(len(sessions))], [f"{i:024x}" for i in range(len(jobs))])
    for (method, path, body), (_, path2, body2) in zip(real, nobodys, strict=True):
        r = api.http.request(method, path, headers=GLOBEX, json=body)
        e = error(r, 404, "not_found")
        # indistinguishable from an id nobody has: the same answer but for the id
        r2 = api.http.request(method, path2, headers=GLOBEX, json=body2)
        e2 = error(r2, 404, "not_found")
        for a, b in zip(sessions + jobs, [f"nobody-{i}" for i in range(len(sessions))]
                        + [f"{i:024x}" for i in range(len(jobs))]):
            e["message"] = e["message"].replace(a, b)
        assert e == e2, (method, path)
    assert api.snapshot(rate_limits=True) == before

    # the list routes do not show acme's sessions and jobs to globex
    sessions = api.http.get("/v1/sessions", headers=GLOBEX, params={"limit": 200})
    assert sessions.status_code == 200 and sessions.json() == {"sessions": []}
    for params in ({}, {"status": "queued"}, {"kind": "turn"}, {"session": world.session},
                   {"session": world.narrative_session}):
        jobs = api.http.get("/v1/jobs", headers=GLOBEX, params=params)
        assert jobs.status_code == 200 and jobs.json() == {"jobs": []}, (params, jobs.text)

    # ... while acme sees all of them, unchanged
    mine = {s["id"] for s in api.http.get("/v1/sessions", headers=ACME).json()["sessions"]}
    assert mine == {world.session, world.narrative_session, world.empty_session}
    jobs = {j["id"]: j for j in api.http.get("/v1/jobs", headers=ACME).json()["jobs"]}
    assert set(jobs) == {world.turn_job, world.narrative_job}
    assert all(j["status"] == "queued" for j in jobs.values())
    assert api.http.get(f"/v1/sessions/{world.session}", headers=ACME).json() == acme_view
    assert api.snapshot(rate_limits=True) == before


def test_globex_works_on_its_own_while_acme_is_untouched(world: World) -> None:
    api = world.api
    acme_sql = [j for j in api.sql_state()["jobs"]]
    r = api.http.post("/v1/jobs", headers=GLOBEX, json={"kind": "narrative", "spec": NARRATIVE})
    assert r.status_code == 202
    theirs = r.json()
    assert api.http.get(f"/v1/jobs/{theirs['id']}", headers=GLOBEX).json()["id"] == theirs["id"]
    error(api.http.get(f"/v1/jobs/{theirs['id']}", headers=ACME), 404, "not_found")
    error(api.http.get(f"/v1/sessions/{theirs['session']}", headers=ACME), 404, "not_found")
    assert {j["id"] for j in api.http.get("/v1/jobs", headers=GLOBEX).json()["jobs"]} == {theirs["id"]}
    assert [s["id"] for s in api.http.get("/v1/sessions", headers=GLOBEX).json()["sessions"]] == [theirs["session"]]
    assert set(acme_sql) < set(api.sql_state()["jobs"])  # acme's rows as they were, plus globex's


def test_a_finished_jobs_events_end_with_its_result(world: World) -> None:
    api = world.api
    r = api.http.post(f"/v1/jobs/{world.narrative_job}/cancel", headers=ACME)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    with api.http.stream("GET", f"/v1/jobs/{world.narrative_job}/events", headers=ACME) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        text = "".join(s.iter_text())
    events = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    assert events == ["status", "status", "result"], text
    assert '"status":"cancelled"' in text.split("event: result")[1]


# ---- API keys -------------------------------------------------------------------------------------

def all_routes(api: Api, w: World) -> Iterator[tuple[str, str, dict[str, Any] | None]]:
    """Every operation of the OpenAPI schema, its path filled with acme's real ids and a valid body."""
    bodies: dict[tuple[str, str], dict[str, Any]] = {
        ("POST", "/v1/sessions/{session_id}/turns"): TURN, ("POST", "/v1/sessions/{session_id}/infill"): INFILL,
        ("POST", "/v1/sessions/{session_id}/fork"): {"turn": 0},
        ("POST", "/v1/jobs"): {"kind": "narrative", "spec": NARRATIVE},
        ("POST", "/v1/jobs/{job_id}/tool_outputs"): {"tool_outputs": [{"call_id": "call_1", "output": "1"}]},
        ("PUT", "/v1/datasets/{name}"): {"rows": [{"metric": "churn", "region": "APAC", "period": "2026-Q3",
                                                 "value": "2.4"}]},
        ("POST", "/v1/schedules"): {"cron": "@daily", "template": {"kind": "narrative", "spec": NARRATIVE}}}
    for path, ops in api.app.openapi()["paths"].items():
        for method in ops:
            m = method.upper()
            yield m, path.format(session_id=w.session, job_id=w.turn_job, name="sales", response_id=f"resp_{w.turn_job}",
                                 conversation_id=f"conv_{w.session}", item_id="msg_" + "0" * 24, model="small",
                                 webhook_id="we_" + "0" * 24, schedule_id="sch_" + "0" * 24, fmt="pdf"), bodies.get((m, path))


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer key-wrong-0001"}, {"X-API-Key": "key-acme-0002"},
                                     {"Authorization": "key-acme-0001"}, {"Authorization": "Bearer "},
                                     {"X-API-Key": "key-acme-000"}, {"Authorization": "Basic a2V5LWFjbWUtMDAwMQ=="}],
                         ids=["none", "wrong-bearer", "wrong-x-api-key", "no-scheme", "empty", "prefix", "basic"])
def test_every_route_needs_a_valid_key(world: World, headers: dict[str, str]) -> None:
    api = world.api
    before = api.snapshot(rate_limits=True)
    expiring = api.expiring(before["redis"])  # may expire meanwhile on a busy machine
    routes = list(all_routes(api, world))
    assert len(routes) >= 13
    checked = 0
    for method, path, body in routes:
        if (method, path) in PUBLIC:
            continue
        r = api.http.request(method, path, headers=headers, json=body)
        e = error(r, 401, "unauthorized")
        assert "API key" in e["message"]
        assert r.headers["www-authenticate"] == "Bearer"
        checked += 1
    assert checked >= 12
    # nothing written: every key as it was, but one whose TTL ran out meanwhile (a state, not a moment)
    was, now = api.unchanged(before, expiring, rate_limits=True)
    assert now == was


def test_both_key_headers_work(world: World) -> None:
    api = world.api
    for headers in (ACME, {"X-API-Key": "key-acme-0001"}, {"authorization": "bearer key-acme-0001"}):
        r = api.http.get(f"/v1/sessions/{world.session}", headers=headers)
        assert r.status_code == 200 and r.json()["id"] == world.session


def test_public_routes_need_no_key(api: Api, make_api: Callable[..., Api]) -> None:
    assert api.http.get("/healthz").json()["status"] == "ok"
    closed = api.http.get("/metrics")  # it names tenants: closed unless a token or the setting opens it
    assert closed.status_code == 401 and "SETFLOW_METRICS_TOKEN" in closed.json()["error"]["message"]
    assert "setflow_jobs" in make_api(metrics_public=True).http.get("/metrics").text
    guarded = make_api(metrics_token="t0ken-metrics")
    assert guarded.http.get("/metrics").status_code == 401
    assert "setflow_jobs" in guarded.http.get("/metrics", headers={"Authorization": "Bearer t0ken-metrics"}).text
    assert api.http.get("/").headers["content-type"].startswith("text/html")
    assert "/v1/sessions" in api.http.get("/openapi.json").json()["paths"]


# ---- validation -----------------------------------------------------------------------------------

BAD: list[tuple[str, str, Any, str]] = [
    # method, path ({s}: acme's session), body, what the message must name
    ("POST", "/v1/sessions/{s}/turns", {"text": "hi", "params": {"window": 0}}, "window"),
    ("POST", "/v1/sessions/{s}/turns", {"text": "hi", "params": {"tau": 2}}, "tau"),
    ("POST", "/v1/sessions/{s}/turns", {"text": "hi", "temperature": 1}, "temperature"),
    ("POST", "/v1/sessions/{s}/turns", {"text": "hi", "input_ids": [1]}, "exactly one of input_ids and text"),
    ("POST", "/v1/sessions/{s}/turns", {"input_ids": ["x"]}, "input_ids"),
    ("POST", "/v1/sessions/{s}/turns", {"text": "hi", "priority": "urgent"}, "priority"),
    ("POST", "/v1/sessions/{s}/turns", {"input_ids": [1] * 5000}, "at most 4096"),
    ("POST", "/v1/sessions/{s}/infill", {"text": "no holes here"}, "text"),
    ("POST", "/v1/sessions/{s}/fork", {"turn": -1}, "turn"),
    ("POST", "/v1/sessions/{s}/fork", {"turn": 5}, "turn"),
    ("POST", "/v1/sessions/{s}/fork", {}, "turn"),
    ("POST", "/v1/jobs", {"kind": "poem", "spec": {}}, "kind"),
    ("POST", "/v1/jobs", {"kind": "narrative"}, "spec"),
    ("POST", "/v1/jobs", {"kind": "narrative", "spec": {**NARRATIVE, "payload": {**NARRATIVE["payload"],
                                                                                  "period": "Q3\t2026"}}},
     "payload.period"),
    ("POST", "/v1/jobs", {"kind": "agent", "spec": {"question": ""}}, "question"),
    ("POST", "/v1/jobs", {"kind": "report", "spec": {**REPORT, "outline": []}}, "outline"),
    ("POST", "/v1/jobs", {"kind": "narrative", "spec": NARRATIVE, "session": "a b"}, "session"),
    ("POST", "/v1/jobs", {"kind": "narrative", "spec": NARRATIVE, "priority": "now"}, "priority"),
    ("GET", "/v1/jobs?limit=0", None, "limit"),
    ("GET", "/v1/jobs?status=done", None, "status"),
    ("GET", "/v1/jobs?kind=narratives", None, "kind"),  # it listed none, as a kind nothing has
    ("GET", "/v1/sessions?limit=201", None, "limit"),
]


@pytest.mark.parametrize("method,path,body,names", BAD, ids=[f"{m} {p.split('/')[-1]} {n}" for m, p, _, n in BAD])
def test_a_bad_request_is_422_naming_the_field(world: World, method: str, path: str, body: Any, names: str) -> None:
    api = world.api
    before = api.snapshot(rate_limits=True)
    r = api.http.request(method, path.format(s=world.session), headers=ACME, json=body)
    e = error(r, 422, "bad_input")
    assert names in e["message"], e
    assert api.snapshot(rate_limits=True) == before  # no row, no event, no message, no token


def test_malformed_json_is_422(world: World) -> None:
    api = world.api
    before = api.snapshot(rate_limits=True)
    r = api.http.post(f"/v1/sessions/{world.session}/turns", headers={**ACME, "Content-Type": "application/json"},
                      content=b'{"text": "hi"')
    error(r, 422, "bad_input")
    assert api.snapshot(rate_limits=True) == before


def test_the_frameworks_own_refusals_have_the_error_shape(world: World) -> None:
    api = world.api
    before = api.snapshot(rate_limits=True)
    error(api.http.get("/v1/nothing-here", headers=ACME), 404, "not_found")
    r = api.http.put(f"/v1/sessions/{world.session}", headers=ACME, json={})
    error(r, 405, "method_not_allowed")
    assert "GET" in r.headers["allow"]
    r = api.http.post(f"/v1/sessions/{world.session}/turns", headers={**ACME, "Content-Type": "application/json"},
                      content=b"\x80")  # not UTF-8: not even text
    error(r, 415, "unsupported_media_type")
    assert api.snapshot(rate_limits=True) == before


def test_an_oversized_body_is_413(make_api: Callable[..., Api]) -> None:
    api = make_api(max_body_bytes=2048)
    sid = api.seed_session()
    before = api.snapshot(rate_limits=True)
    big = {"text": "x" * 3000}
    for path, body in ((f"/v1/sessions/{sid}/turns", big), (f"/v1/sessions/{sid}/infill", {"text": "<hole>" * 500}),
                       ("/v1/jobs", {"kind": "turn", "spec": big, "session": sid})):
        error(api.http.post(path, headers=ACME, json=body), 413, "too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the body is counted as it arrives
        yield b'{"text": "'
        for _ in range(10):
            yield b"y" * 300
        yield b'"}'

    r = api.http.post(f"/v1/sessions/{sid}/turns", headers={**ACME, "Content-Type": "application/json"},
                      content=chunks())
    error(r, 413, "too_large")
    assert api.snapshot(rate_limits=True) == before
    # just under the limit is fine
    r = api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json={"text": "revenue: up\n" * 120})
    assert r.status_code == 202, r.text


# ---- rate limits ----------------------------------------------------------------------------------

def test_the_fourth_submission_in_a_row_is_rate_limited(make_api: Callable[..., Api]) -> None:
    api = make_api(tenant_burst=3, tenant_rate_per_s=0.02)
    sid = api.seed_session("acme", turns=1)  # behind the API: no token spent
    for _ in range(3):
        r = api.http.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE})
        assert r.status_code == 202, r.text
    before = api.snapshot()
    jobs = api.job_count()
    # every kind of submission takes from the same bucket, and none of them writes anything
    for method, path, body in (("POST", "/v1/jobs", {"kind": "narrative", "spec": NARRATIVE}),
                               ("POST", "/v1/jobs", {"kind": "agent", "spec": AGENT, "session": sid}),
                               ("POST", f"/v1/sessions/{sid}/turns", TURN),
                               ("POST", f"/v1/sessions/{sid}/infill", INFILL),
                               ("POST", f"/v1/sessions/{sid}/fork", {"turn": 0}),
                               ("POST", "/v1/sessions", None),
                               ("DELETE", f"/v1/sessions/{sid}", None)):
        r = api.http.request(method, path, headers=ACME, json=body)
        e = error(r, 429, "rate_limited")
        assert r.headers["retry-after"].isdigit() and int(r.headers["retry-after"]) >= 1, r.headers
        assert isinstance(e["retry_after_s"], float | int) and e["retry_after_s"] > 0
        assert int(r.headers["retry-after"]) >= e["retry_after_s"]
        assert api.job_count() == jobs
    assert api.snapshot() == before
    assert api.http.get(f"/v1/sessions/{sid}", headers=ACME).status_code == 200  # reads are not limited

    # another tenant has a bucket of its own
    r = api.http.post("/v1/jobs", headers=GLOBEX, json={"kind": "narrative", "spec": NARRATIVE})
    assert r.status_code == 202, r.text
    assert api.job_count() == jobs + 1
    error(api.http.post("/v1/sessions", headers=ACME), 429, "rate_limited")  # acme is still limited


def test_a_refused_submission_takes_no_token(make_api: Callable[..., Api]) -> None:
    """Bad input, an unknown session: refused before the bucket is touched."""
    api = make_api(tenant_burst=3, tenant_rate_per_s=0.02)
    for _ in range(5):
        error(api.http.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": {}}), 422, "bad_input")
        error(api.http.post(f"/v1/sessions/{NO_SESSION}/turns", headers=ACME, json=TURN), 404, "not_found")
        error(api.http.post(f"/v1/sessions/{NO_SESSION}/fork", headers=ACME, json={"turn": 0}), 404, "not_found")
    for _ in range(3):
        assert api.http.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE}).status_code == 202
    error(api.http.post("/v1/jobs", headers=ACME, json={"kind": "narrative", "spec": NARRATIVE}), 429, "rate_limited")
