"""What a request must be before its body is read (runtime/api/gate.py): a write's API key
first (401 for a stranger, whose body is not read at all), then its size, then UTF-8 (415 for a
UTF-16 or UTF-32 body, or a charset that is not UTF-8); none of them changes any state."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
from starlette.types import Message

from runtime.api.gate import charset_problem, lone_surrogate
from runtime.jobs import fairness as ratelimit
from tests.runtime.api.conftest import ACME, GLOBEX, NARRATIVE, Api

BAD_JSON = b'{"kind": "narrative", "spec": '  # cut short: a 422 if it were parsed


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer not-a-key-000"}])
@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/jobs"), ("POST", "/v1/responses"),
                                              ("PUT", "/v1/datasets/sales"), ("POST", "/v1/sessions/s1/turns")])
def test_a_stranger_is_refused_before_its_body_is_parsed(api: Api, headers: dict[str, str], method: str,
                                                         path: str) -> None:
    before = api.snapshot()
    r = api.http.request(method, path, content=BAD_JSON, headers={**headers, "Content-Type": "application/json"})
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert r.json()["error"]["code"] == "unauthorized"
    huge = api.http.request(method, path, content=b"x" * (api.s.max_body_bytes + 1), headers=headers)
    assert huge.status_code == 401  # not 413: its size is nobody's business but a tenant's
    assert api.snapshot() == before


def post_asgi(api: Api, headers: list[tuple[bytes, bytes]]) -> tuple[list[Message], list[str]]:
    """POST /v1/jobs (a malformed JSON body) through the app's whole middleware stack at the ASGI
    level: (the messages sent back, one entry per time the app asked for the body)."""
    reads: list[str] = []
    sent: list[Message] = []

    async def receive() -> Message:
        reads.append("body")
        return {"type": "http.request", "body": BAD_JSON, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: dict[str, Any] = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                             "scheme": "http", "path": "/v1/jobs", "raw_path": b"/v1/jobs", "query_string": b"",
                             "root_path": "", "headers": [(b"content-type", b"application/json"), *headers],
                             "client": ("127.0.0.1", 1), "server": ("testserver", 80), "app": api.app}
    asyncio.run(api.app.build_middleware_stack()(scope, receive, send))
    return sent, reads


def test_a_strangers_body_is_not_read(api: Api) -> None:
    """At the ASGI level: the app answers 401 without once asking for the body."""
    sent, reads = post_asgi(api, [])
    assert sent[0]["status"] == 401 and reads == []


def test_a_tenant_over_its_rate_is_refused_before_its_body_is_read(make_api: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a take found its bucket empty, the tenant's writes get 429 at the door until its next
    token is due (a second at most): no body read, no parse, no Redis round trip (a flood past
    the rate costs a header lookup); another tenant is served, and once the token is due the
    tenant is too."""
    monkeypatch.setattr(ratelimit, "MEMO_S", 5.0)  # a window no loaded machine outlasts between two lines
    api: Api = make_api(tenant_burst=1, tenant_rate_per_s=0.2)
    job = {"kind": "narrative", "spec": NARRATIVE}
    assert api.http.post("/v1/jobs", headers=ACME, json=job).status_code == 202  # the one token
    refused = api.http.post("/v1/jobs", headers=ACME, json=job)  # Redis says: empty for ~5 s
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    assert "requests/s" in refused.json()["error"]["message"]
    before, bucket = api.snapshot(rate_limits=True), api.r.hgetall(api.keys.bucket("acme"))
    sent, reads = post_asgi(api, [(b"authorization", ACME["Authorization"].encode())])
    assert sent[0]["status"] == 429 and reads == []
    assert int(dict(sent[0]["headers"])[b"retry-after"]) in range(1, 6)
    assert api.snapshot(rate_limits=True) == before, "nothing written"
    assert api.r.hgetall(api.keys.bucket("acme")) == bucket, "the bucket not even asked (its script stamps ts)"
    assert api.http.post("/v1/jobs", headers=GLOBEX, json=job).status_code == 202
    deadline = time.monotonic() + 15
    while (r := api.http.post("/v1/jobs", headers=ACME, json=job)).status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert r.status_code == 202, "served again once its token is due"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_a_utf16_or_utf32_json_body_is_refused_with_415(api: Api, encoding: str) -> None:
    before = api.snapshot()
    body = json.dumps({"kind": "narrative", "spec": NARRATIVE}).encode(encoding)
    r = api.http.post("/v1/jobs", content=body, headers={**ACME, "Content-Type": "application/json"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", r.text
    assert "UTF-8" in r.json()["error"]["message"]
    assert api.snapshot() == before


@pytest.mark.parametrize("charset", ["utf-16", "latin-1", "\"iso-8859-1\""])
def test_a_charset_other_than_utf8_is_refused_with_415(api: Api, charset: str) -> None:
    before = api.snapshot()
    r = api.http.post("/v1/jobs", content=json.dumps({"kind": "narrative", "spec": NARRATIVE}).encode(),
                      headers={**ACME, "Content-Type": f"application/json; charset={charset}"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    assert api.snapshot() == before


def test_an_openai_route_refuses_a_utf16_body_in_openais_shape(api: Api) -> None:
    r = api.http.post("/v1/responses", content=json.dumps({"model": "setflow", "input": "hi"}).encode("utf-16"),
                      headers={**ACME, "Content-Type": "application/json"})
    assert r.status_code == 415
    assert r.json()["error"]["code"] == "unsupported_media_type" and "type" in r.json()["error"]


@pytest.mark.parametrize("charset", ["utf-8", "UTF-8", "\"utf-8\"", "us-ascii"])
def test_utf8_bodies_pass_with_or_without_a_charset(api: Api, charset: str) -> None:
    for content_type in ("application/json", f"application/json; charset={charset}"):
        r = api.http.post("/v1/jobs", content=json.dumps({"kind": "narrative", "spec": NARRATIVE}).encode(),
                          headers={**ACME, "Content-Type": content_type})
        assert r.status_code == 202, r.text


@pytest.mark.parametrize(("content_type", "head", "ok"), [
    ("application/json", b'{"a"', True), ("application/json", b"\xef\xbb\xbf{", True),  # a UTF-8 BOM
    ("application/json", b"{", True), ("application/json", b"", True),  # short bodies
    ("application/json", '{"'.encode("utf-16-le"), False), ("application/json", "{".encode("utf-16"), False),
    ("text/csv; charset=utf-8", b"a,b,", True), ("text/csv; charset=windows-1252", b"a,b,", False)])
def test_charset_problem(content_type: str, head: bytes, ok: bool) -> None:
    assert (charset_problem(content_type, head) is None) == ok


@pytest.mark.parametrize(("path", "method", "body"), [
    ("/v1/jobs", "POST", b'{"kind": "agent", "spec": {"question": "What was churn in \\ud800?"}}'),
    ("/v1/datasets/sales", "PUT", b'{"rows": [{"metric": "rev\\udc00", "region": "EMEA", "period": "2026", "value": 5}]}'),
    ("/v1/conversations", "POST", b'{"metadata": {"team": "\\ud83d"}}')])
def test_a_json_string_with_a_lone_surrogate_is_refused_and_changes_nothing(api: Api, path: str, method: str,
                                                                          body: bytes) -> None:
    """Python's json takes `\\ud800` alone into a str that no UTF-8 writer can write back: a GET of
    what it went into would fail with a 500.  Refused at the door instead."""
    before = api.snapshot()
    r = api.http.request(method, path, content=body, headers={**ACME, "Content-Type": "application/json"})
    assert r.status_code in (400, 422) and r.json()["error"]["code"] == "bad_input", r.text
    assert "surrogate" in r.json()["error"]["message"]
    assert api.snapshot() == before


def test_a_lone_surrogate_is_refused_in_a_body_that_names_no_type(api: Api) -> None:
    """FastAPI reads a body without a Content-Type as JSON: the same check applies."""
    before = api.snapshot()
    r = api.http.post("/v1/jobs", content=b'{"kind": "agent", "spec": {"question": "Churn in \\ud800?"}}', headers=ACME)
    assert r.status_code == 422 and "surrogate" in r.json()["error"]["message"], r.text
    assert api.snapshot() == before


def test_a_surrogate_pair_and_an_escaped_backslash_pass(api: Api) -> None:
    """`\\ud83d\\ude00` is one character (an emoji); `\\\\ud800` is a backslash and text."""
    body = b'{"kind": "agent", "spec": {"question": "What was churn in \\ud83d\\ude00 \\\\ud800 in 2026-Q3?"}}'
    r = api.http.post("/v1/jobs", content=body, headers={**ACME, "Content-Type": "application/json"})
    assert r.status_code == 202, r.text


def test_a_body_of_bytes_that_are_not_utf8_is_refused_with_415(api: Api) -> None:
    body = json.dumps({"kind": "agent", "spec": {"question": "Umsatz in München?"}}, ensure_ascii=False).encode("latin-1")
    r = api.http.post("/v1/jobs", content=body, headers={**ACME, "Content-Type": "application/json"})
    assert r.status_code == 415 and "UTF-8" in r.json()["error"]["message"]


@pytest.mark.parametrize(("body", "at"), [
    (b'"a\\ud800"', 2), (b'"\\ud83d\\ude00"', None), (b'"\\\\ud800"', None), (b'"\\\\\\ud800"', 3),
    (b'"\\udc00"', 1), (b'"\\ud800\\ud800\\udc00"', 1), (b'"\\ud800x\\udc00"', 1), (b'"\\uD800"', 1),
    (b'{"a": 1}', None), (b'"\\u00e9\\n\\\\"', None)])
def test_lone_surrogate(body: bytes, at: int | None) -> None:
    assert lone_surrogate(body) == at


def test_an_unhandled_error_is_a_json_500_and_one_log_line(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    def boom() -> None:
        raise RuntimeError("a tenant's input, never logged")
    api.app.add_api_route("/v1/boom", boom, methods=["GET"])
    with caplog.at_level(logging.INFO):
        r = api.http.get("/v1/boom", headers=ACME)
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal"
    lines = [x for x in caplog.records if x.levelno >= logging.ERROR]
    assert len(lines) == 1 and lines[0].exc_info is None and "never logged" not in lines[0].getMessage()


def test_a_deeply_nested_tool_schema_is_a_clear_400(api: Api) -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}}
    r = api.http.post("/v1/responses", headers=ACME, json={"model": "small", "input": "hi",
                                                          "tools": [{"type": "function", "name": "f", "parameters": deep}]})
    assert r.status_code == 400 and "deeper than 32" in r.json()["error"]["message"], r.text
