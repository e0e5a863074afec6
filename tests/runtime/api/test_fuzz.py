"""Schemathesis over the API's own OpenAPI schema, as tenant acme: every operation with
positive (schema-valid) and negative (schema-invalid) requests, its path parameters random or
naming real sessions and jobs (a job's report exports too, of a succeeded narrative).  Two properties:

- no 5xx, ever;
- a rejected request (>= 400, 429 included) changes nothing: the sessions, turns and jobs rows
  and the Redis keys under the prefix (type and size) are as before.  The rate-limit buckets
  are left out: an accepted submission changes its bucket, a refused one refills it.

Bounded and repeatable: derandomized, a few dozen examples per operation and variant.  The SSE
route (GET /v1/jobs/{id}/events) is left out: a job that never runs never ends its stream; its
401/404 are tested by hand here and in test_tenants.py."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from runtime.jobs.fairness import RateLimiter
from tests.runtime.api.conftest import ACME, AGENT, GLOBEX, INFILL, NARRATIVE, REPORT, TURN, Api, running_api
from tests.runtime.api.test_exports import narrative_result

EXAMPLES = 30
EVENTS = ("GET", "/v1/jobs/{job_id}/events")
SESSION_OPS = [("GET", "/v1/sessions/{session_id}"), ("DELETE", "/v1/sessions/{session_id}"),
               ("POST", "/v1/sessions/{session_id}/turns"), ("POST", "/v1/sessions/{session_id}/infill"),
               ("POST", "/v1/sessions/{session_id}/fork")]
JOB_OPS = [("GET", "/v1/jobs/{job_id}"), ("POST", "/v1/jobs/{job_id}/cancel")]
TOOL_OUTPUTS = ("POST", "/v1/jobs/{job_id}/tool_outputs")
REPORT_EXPORT = ("GET", "/v1/jobs/{job_id}/report.{fmt}")  # md, html, pdf, json of a succeeded narrative or report
DATASET_OPS = [("PUT", "/v1/datasets/{name}"), ("GET", "/v1/datasets/{name}"), ("DELETE", "/v1/datasets/{name}")]
OTHER_OPS = [("POST", "/v1/sessions"), ("GET", "/v1/sessions"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs"),
             ("GET", "/healthz"), ("GET", "/metrics"), ("GET", "/v1/datasets")]
#: OpenAI's routes (the Responses API), with random ids: a response's stream (GET ...?stream=true)
#: of a real job that never runs would never end
OPENAI_OPS = [("POST", "/v1/responses"), ("GET", "/v1/responses/{response_id}"),
              ("POST", "/v1/responses/{response_id}/cancel"), ("DELETE", "/v1/responses/{response_id}"),
              ("GET", "/v1/responses/{response_id}/input_items"), ("POST", "/v1/conversations"),
              ("GET", "/v1/conversations/{conversation_id}"), ("POST", "/v1/conversations/{conversation_id}"),
              ("DELETE", "/v1/conversations/{conversation_id}"), ("GET", "/v1/conversations/{conversation_id}/items"),
              ("POST", "/v1/conversations/{conversation_id}/items"),
              ("GET", "/v1/conversations/{conversation_id}/items/{item_id}"),
              ("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}"), ("GET", "/v1/models"),
              ("GET", "/v1/models/{model}"), ("POST", "/v1/responses/compact")]
WEBHOOK_OPS = [("POST", "/v1/webhooks"), ("GET", "/v1/webhooks"), ("GET", "/v1/webhooks/{webhook_id}"),
               ("DELETE", "/v1/webhooks/{webhook_id}")]
SCHEDULE_OPS = [("POST", "/v1/schedules"), ("GET", "/v1/schedules"), ("GET", "/v1/schedules/{schedule_id}"),
                ("POST", "/v1/schedules/{schedule_id}/pause"), ("POST", "/v1/schedules/{schedule_id}/resume"),
                ("DELETE", "/v1/schedules/{schedule_id}")]
NO_PARAMETERS = {("POST", "/v1/sessions"), ("GET", "/healthz"), ("GET", "/metrics"),
                 ("GET", "/v1/datasets"), ("GET", "/v1/models"), ("GET", "/v1/webhooks"),
                 ("POST", "/v1/responses/compact")}  # nothing to make invalid
ONLY_AN_ID = {("GET", "/v1/sessions/{session_id}"), ("DELETE", "/v1/sessions/{session_id}"),
              ("GET", "/v1/jobs/{job_id}"), ("POST", "/v1/jobs/{job_id}/cancel")}  # nothing else to make invalid
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=False,
                phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
STATUSES: Counter[tuple[str, str, int]] = Counter()  # (operation, variant, status): what the fuzz reached


@pytest.fixture(scope="module")
def fuzz_api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    # a small bucket, so that some submissions are refused with 429 (which must write nothing)
    # no worker runs here: a response is answered as it is (queued) after a moment
    with running_api(redis_url, tmp_path_factory.mktemp("fuzz"), tenant_burst=8, tenant_rate_per_s=2.0,
                     response_wait_s=0.2) as api:
        yield api


@pytest.fixture(scope="module")
def schema(fuzz_api: Api) -> Iterator[Any]:
    loaded = schemathesis.openapi.from_asgi("/openapi.json", fuzz_api.app)
    yield loaded
    from schemathesis.python import asgi

    asgi.shutdown_lifespans()  # the lifespan schemathesis started for the app (it closes its clients)


def full_bucket(api: Api, tenant: str) -> None:
    """The tenant's rate-limit bucket full again: its key gone (a new bucket is full), and no
    refusal remembered in this process (RateLimiter's memo)."""
    bucket = api.keys.bucket(tenant)
    api.r.delete(bucket)
    RateLimiter._empty_until.pop(bucket, None)


def seeds(api: Api) -> dict[str, str]:
    """Fresh real ids for one operation's fuzz, written behind the API (no rate-limit token):
    a session with two turns, one without turns, a queued job, a cancelled one and one waiting
    for its client's output of call_1 (as a worker leaves it)."""
    queued, _ = api.svc.jobs.create("narrative", "acme", NARRATIVE, None, "interactive", open_session=True)
    cancelled, _ = api.svc.jobs.create("agent", "acme", AGENT, None, "interactive", open_session=True)
    api.svc.jobs.cancel(cancelled.id, "acme")
    waiting, _ = api.svc.jobs.create("agent", "acme", {**AGENT, "client_tools": ["metric"]}, None, "interactive",
                                     open_session=True)
    owner = api.svc.jobs.claim(waiting.id, "fuzz-worker").owner
    assert owner is not None
    api.svc.jobs.suspend(waiting.id, owner, [{"id": "call_1", "tool": "metric", "call": 'metric("churn", "APAC", "2026-Q3")',
                                              "arguments": {"metric": "churn", "region": "APAC", "period": "2026-Q3"}}], 3600)
    return {"session": api.seed_session("acme", turns=2), "empty": api.svc.records.create_session("acme", "").id,
            "queued": queued.id, "cancelled": cancelled.id, "waiting": waiting.id}


def fuzz(api: Api, schema: Any, method: str, path: str, mode: GenerationMode, variant: str,
         path_parameters: dict[str, str] | None = None) -> None:
    op = schema[path][method]
    label = f"{method} {path}"
    strategy = op.as_strategy(generation_mode=mode, path_parameters=path_parameters)
    if path.endswith("/infill") and mode is GenerationMode.POSITIVE:
        strategy = strategy.map(_with_a_hole)  # what the schema cannot say: the text has a hole

    @FUZZ
    @given(case=strategy)
    def run(case: Any) -> None:
        before = api.snapshot()
        expiring = api.expiring(before["redis"])  # e.g. a stream an earlier cancel left for 60 s (JobEvents.never_ran)
        response = case.call(headers=ACME)
        case.validate_response(response, checks=[not_a_server_error])
        STATUSES[(label, variant, response.status_code)] += 1
        if response.status_code >= 400:
            was, now = api.unchanged(before, expiring)  # every key as it was, but one whose TTL ran out meanwhile
            assert now == was, f"{label} -> {response.status_code} {response.text[:300]} changed state"
            body = response.json()
            assert set(body) == {"error"} and body["error"]["code"] and body["error"]["message"], body

    run()


def _with_a_hole(case: Any) -> Any:
    if isinstance(case.body, dict) and isinstance(case.body.get("text"), str):
        case.body["text"] = case.body["text"][: len(case.body["text"]) // 2] + "<hole>"
    return case


def statuses(label: str, variant: str) -> set[int]:
    return {s for (lab, var, s) in STATUSES if lab == label and var == variant}


def test_the_fuzz_covers_every_operation(schema: Any) -> None:
    ops = {(method.upper(), path) for path, item in schema.raw_schema["paths"].items() for method in item}
    assert ops == set(SESSION_OPS + JOB_OPS + OTHER_OPS + DATASET_OPS + OPENAI_OPS + WEBHOOK_OPS + SCHEDULE_OPS) | {
        EVENTS, TOOL_OUTPUTS, REPORT_EXPORT}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("method,path", OTHER_OPS, ids=[f"{m} {p}" for m, p in OTHER_OPS])
def test_fuzz(fuzz_api: Api, schema: Any, method: str, path: str, mode: GenerationMode) -> None:
    if mode is GenerationMode.NEGATIVE and (method, path) in NO_PARAMETERS:
        pytest.skip("no parameters or body to make invalid")
    seeds(fuzz_api)  # something to list
    fuzz(fuzz_api, schema, method, path, mode, str(mode))
    seen = statuses(f"{method} {path}", str(mode))
    assert seen and max(seen) < 500
    if mode is GenerationMode.NEGATIVE:
        assert seen & {400, 401, 404, 405, 413, 415, 422}, seen  # something was refused


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("variant", ["random", "session", "empty"])
@pytest.mark.parametrize("method,path", SESSION_OPS,
                         ids=[f"{m} {p.split('}')[-1] or 'session'}" for m, p in SESSION_OPS])
def test_fuzz_on_sessions(fuzz_api: Api, schema: Any, method: str, path: str, variant: str,
                          mode: GenerationMode) -> None:
    if mode is GenerationMode.NEGATIVE and variant != "random" and (method, path) in ONLY_AN_ID:
        pytest.skip("the id is fixed and there is nothing else to make invalid")
    ids = seeds(fuzz_api)
    fixed = None if variant == "random" else {"session_id": ids[variant]}
    fuzz(fuzz_api, schema, method, path, mode, f"{variant} {mode}", fixed)
    seen = statuses(f"{method} {path}", f"{variant} {mode}")
    assert seen and max(seen) < 500
    if variant == "random":
        assert 404 in seen or 422 in seen, seen  # nobody's session (or not an id at all)
    elif mode is GenerationMode.POSITIVE and method == "GET":
        assert seen == {200}, seen  # a real session is read whatever else was generated


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("variant", ["random", "queued", "cancelled"])
@pytest.mark.parametrize("method,path", JOB_OPS, ids=[f"{m} {p}" for m, p in JOB_OPS])
def test_fuzz_on_jobs(fuzz_api: Api, schema: Any, method: str, path: str, variant: str, mode: GenerationMode) -> None:
    if mode is GenerationMode.NEGATIVE and variant != "random" and (method, path) in ONLY_AN_ID:
        pytest.skip("the id is fixed and there is nothing else to make invalid")
    ids = seeds(fuzz_api)
    fixed = None if variant == "random" else {"job_id": ids[variant]}
    fuzz(fuzz_api, schema, method, path, mode, f"{variant} {mode}", fixed)
    seen = statuses(f"{method} {path}", f"{variant} {mode}")
    assert seen and max(seen) < 500
    if mode is GenerationMode.POSITIVE and variant != "random":
        assert seen == {200}, seen
    got = fuzz_api.svc.jobs.get(ids["cancelled"], "acme")
    assert got.status == "cancelled"  # a finished job stays as it is, cancel or not


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("variant", ["random", "queued", "waiting"])
def test_fuzz_tool_outputs(fuzz_api: Api, schema: Any, variant: str, mode: GenerationMode) -> None:
    ids = seeds(fuzz_api)
    method, path = TOOL_OUTPUTS
    fixed = None if variant == "random" else {"job_id": ids[variant]}
    fuzz(fuzz_api, schema, method, path, mode, f"{variant} {mode}", fixed)
    seen = statuses(f"{method} {path}", f"{variant} {mode}")
    assert seen and max(seen) < 500
    if mode is GenerationMode.POSITIVE and variant == "queued":
        # a well-formed answer to a job that waits for none; 422: what the schema cannot say (a call twice)
        assert seen <= {404, 409, 422}, seen
    if mode is GenerationMode.POSITIVE and variant == "waiting":
        assert seen <= {202, 404, 409, 422}, seen  # call_1 answered once (then already_answered); others unknown


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("variant", ["random", "queued", "succeeded"])
def test_fuzz_report_export(fuzz_api: Api, schema: Any, variant: str, mode: GenerationMode) -> None:
    """The exports of a job id that is nobody's, of a queued job (409), of a succeeded narrative
    (every format and detail renders: 200)."""
    ids = seeds(fuzz_api)
    done, _ = fuzz_api.svc.jobs.create("narrative", "acme", NARRATIVE, None, "interactive", open_session=True)
    owner = fuzz_api.svc.jobs.claim(done.id, "fuzz-worker").owner
    assert owner is not None
    fuzz_api.svc.jobs.finish(done.id, owner, "succeeded", result=narrative_result(NARRATIVE))
    full_bucket(fuzz_api, "acme")  # the case's first exports are served, however the cases before it ran
    method, path = REPORT_EXPORT
    fixed = None if variant == "random" else {"job_id": ids["queued"] if variant == "queued" else done.id}
    fuzz(fuzz_api, schema, method, path, mode, f"{variant} {mode}", fixed)
    seen = statuses(f"{method} {path}", f"{variant} {mode}")
    assert seen and max(seen) < 500
    # an export takes a rate-limit token: past the small bucket, a 429
    if mode is GenerationMode.POSITIVE and variant == "queued":
        assert seen - {429} == {409}, seen
    if mode is GenerationMode.POSITIVE and variant == "succeeded":
        assert seen - {429} == {200}, seen


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("method,path", DATASET_OPS, ids=[m for m, _ in DATASET_OPS])
def test_fuzz_datasets(fuzz_api: Api, schema: Any, method: str, path: str, mode: GenerationMode) -> None:
    fuzz_api.http.put("/v1/datasets/sales", headers=ACME, json={"rows": [
        {"metric": "revenue", "region": "EMEA", "period": "2026-Q3", "value": "512"}]})
    fuzz(fuzz_api, schema, method, path, mode, str(mode))
    seen = statuses(f"{method} {path}", str(mode))
    assert seen and max(seen) < 500


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("method,path", OPENAI_OPS + WEBHOOK_OPS + SCHEDULE_OPS,
                         ids=[f"{m} {p}" for m, p in OPENAI_OPS + WEBHOOK_OPS + SCHEDULE_OPS])
def test_fuzz_more(fuzz_api: Api, schema: Any, method: str, path: str, mode: GenerationMode) -> None:
    if mode is GenerationMode.NEGATIVE and (method, path) in NO_PARAMETERS:
        pytest.skip("no parameters or body to make invalid")
    fuzz(fuzz_api, schema, method, path, mode, str(mode))
    seen = statuses(f"{method} {path}", str(mode))
    assert seen and max(seen) < 500


# ---- job specs: the schema says only "an object"; these are near-valid ones ---------------------

SPECS = {"narrative": NARRATIVE, "agent": AGENT, "report": REPORT, "turn": TURN, "infill": INFILL}
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
                    | st.text(max_size=20), lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)


def _mutate(spec: Any, path: list[int], value: Any) -> Any:
    """spec with one value replaced (or, for "<drop>", its key dropped): path[i] picks the
    i-th key (sorted) or element at each level, as deep as the spec goes."""
    if not path or not isinstance(spec, dict | list) or not spec:
        return value
    if isinstance(spec, dict):
        key = sorted(spec)[path[0] % len(spec)]
        out = dict(spec)
        if value == "<drop>" and (len(path) == 1 or not isinstance(spec[key], dict | list)):
            del out[key]
        else:
            out[key] = _mutate(spec[key], path[1:], value)
        return out
    items = list(spec)
    items[path[0] % len(items)] = _mutate(items[path[0] % len(items)], path[1:], value)
    return items


@st.composite
def job_requests(draw: st.DrawFn, sessions: list[str]) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(SPECS)))
    spec: Any = SPECS[draw(st.sampled_from(sorted(SPECS)))] if draw(st.integers(0, 4)) == 0 else SPECS[kind]
    for _ in range(draw(st.integers(0, 2))):
        spec = _mutate(spec, draw(st.lists(st.integers(0, 7), max_size=4)), draw(JSON | st.just("<drop>")))
    if draw(st.integers(0, 9)) == 0:
        spec = {**spec, "bogus": 1} if isinstance(spec, dict) else spec
    body: dict[str, Any] = {"kind": kind, "spec": spec}
    session = draw(st.sampled_from([None, "nobody", *sessions]))
    if session is not None:
        body["session"] = session
    if draw(st.booleans()):
        body["priority"] = draw(st.sampled_from(["interactive", "batch", "urgent"]))
    return body


def test_fuzz_job_specs(fuzz_api: Api) -> None:
    api = fuzz_api
    ids = seeds(api)
    theirs = api.svc.records.create_session("globex", "").id
    api.r.delete(api.keys.bucket("acme"))  # a full bucket: the first valid submissions are accepted
    seen: Counter[int] = Counter()

    @settings(max_examples=150, deadline=None, derandomize=True, database=None, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(body=job_requests([ids["session"], ids["empty"], theirs]))
    def run(body: dict[str, Any]) -> None:
        before = api.snapshot()
        r = api.http.post("/v1/jobs", headers=ACME, json=body)
        seen[r.status_code] += 1
        assert r.status_code in (202, 404, 422, 429), r.text
        if r.status_code >= 400:
            assert api.snapshot() == before, (body, r.text)
        else:
            assert r.json()["status"] == "queued" and r.json()["kind"] == body["kind"]
            if "session" in body:
                assert r.json()["session"] == body["session"]

    run()
    assert seen[422] and seen[404] and seen[202], seen


def test_events_route_by_hand(fuzz_api: Api) -> None:
    """The SSE route, left out of the fuzz: refused before any stream starts."""
    api = fuzz_api
    ids = seeds(api)
    before = api.snapshot(rate_limits=True)
    for headers, status, code in ((ACME, 404, "not_found"), (GLOBEX, 404, "not_found"), ({}, 401, "unauthorized")):
        for jid in ("0" * 24, ids["queued"]) if headers is not ACME else ("0" * 24, "f" * 24):
            r = api.http.get(f"/v1/jobs/{jid}/events", headers=headers)
            assert r.status_code == status and r.json()["error"]["code"] == code, r.text
    for bad in ("not-a-job", "0" * 23, "0" * 25, "A" * 24):
        r = api.http.get(f"/v1/jobs/{bad}/events", headers=ACME)
        assert r.status_code == 422 and r.json()["error"]["code"] == "bad_input", r.text
    for params, headers in (({"after": "x"}, ACME), ({}, {**ACME, "Last-Event-ID": "12"})):
        r = api.http.get(f"/v1/jobs/{ids['queued']}/events", params=params, headers=headers)
        assert r.status_code == 422 and r.json()["error"]["code"] == "bad_input", r.text
    assert api.snapshot(rate_limits=True) == before
    time.sleep(1.0 / api.s.tenant_rate_per_s + 0.1)  # a token for the stream, whatever the fuzz left in the bucket
    # and a finished job's stream ends by itself
    with api.http.stream("GET", f"/v1/jobs/{ids['cancelled']}/events", headers=ACME) as s:
        text = "".join(s.iter_text())
    assert s.status_code == 200 and "event: result" in text and '"status":"cancelled"' in text
    # an EventSource reconnecting with the last id it read is told to stop (204), not fed it again
    for status in ("running", "cancelled"):
        api.svc.dispatcher.events.publish("acme", ids["cancelled"], {"type": "status", "status": status})
    with api.http.stream("GET", f"/v1/jobs/{ids['cancelled']}/events", headers=ACME) as s:
        text = "".join(s.iter_text())
    last = [line[4:] for line in text.splitlines() if line.startswith("id: ")][-1]
    r = api.http.get(f"/v1/jobs/{ids['cancelled']}/events", headers={**ACME, "Last-Event-ID": last})
    assert r.status_code == 204 and r.content == b""
    first = [line[4:] for line in text.splitlines() if line.startswith("id: ")][0]
    with api.http.stream("GET", f"/v1/jobs/{ids['cancelled']}/events", headers={**ACME, "Last-Event-ID": first}) as s:
        assert s.status_code == 200 and "event: result" in "".join(s.iter_text()), "what it missed, then the end"
