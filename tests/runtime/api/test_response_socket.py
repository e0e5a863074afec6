"""WebSocket mode on /v1/responses (runtime/api/openai/websocket.py), the protocol without
workers (the app on the real Redis, its jobs left queued): a bad or missing key refused at the
upgrade with OpenAI's 401, changing nothing; each bad frame answered with OpenAI's error event,
changing nothing, and the socket goes on to run the next good one; the events of a created
response as the SSE stream numbers them; a socket's bounds (its tenant's streams, its idle
time, its hour, ended with the spec's websocket_connection_limit_reached); a previous response
that is not there, or is another socket's store-false one: previous_response_not_found, as the
Open Responses spec's WebSocket mode names it.  The chain over real workers, dropped and
resumed, and a store-false chain on its own socket: test_responses_socket.py."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from runtime.api.openai import websocket as response_socket
from runtime.errors import NotFound
from tests.runtime.api.conftest import ACME, Api

CREATE: dict[str, Any] = {"type": "response.create", "model": "small", "input": "Revenue rose in EMEA",
                          "max_output_tokens": 4}


def error_event(ws: Any) -> dict[str, Any]:
    ev: dict[str, Any] = ws.receive_json()
    assert ev["type"] == "error" and set(ev) <= {"type", "status", "error", "stream_id"}, ev
    assert {"type", "code", "message", "param"} <= set(ev["error"]), ev
    return ev


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-not-a-key"}])
def test_an_upgrade_without_a_valid_key_is_a_401_and_changes_nothing(make_api: Callable[..., Api],
                                                                      headers: dict[str, str]) -> None:
    api = make_api()
    before = api.snapshot(rate_limits=True)
    with pytest.raises(WebSocketDenialResponse) as e:
        with api.http.websocket_connect("/v1/responses", headers=headers):
            pass
    assert e.value.status_code == 401 and e.value.headers["www-authenticate"] == "Bearer"
    err = e.value.json()["error"]
    assert err["type"] == "authentication_error" and err["code"] == "unauthorized" and "API key" in err["message"]
    assert api.snapshot(rate_limits=True) == before


def test_bad_frames_get_error_events_change_nothing_and_the_socket_goes_on(make_api: Callable[..., Api]) -> None:
    api = make_api(max_body_bytes=4096)
    before = api.snapshot()
    with api.http.websocket_connect("/v1/responses", headers=ACME) as ws:
        ws.send_text("{not json")
        assert "one JSON object" in error_event(ws)["error"]["message"]
        ws.send_text("[1, 2]")
        assert error_event(ws)["error"]["code"] == "bad_input"
        ws.send_bytes(json.dumps(CREATE).encode())
        assert "text frame" in error_event(ws)["error"]["message"]
        ws.send_json({**CREATE, "type": "response.steer", "stream_id": "lane-1"})
        ev = error_event(ws)
        assert ev["error"]["param"] == "type" and ev["stream_id"] == "lane-1" and ev["status"] == 400
        ws.send_json({**CREATE, "background": True})
        assert error_event(ws)["error"]["param"] == "background"
        ws.send_json({**CREATE, "temprature": 0.5})
        ev = error_event(ws)
        assert ev["error"] == {"type": "invalid_request_error", "code": "bad_input", "param": "temprature",
                               "message": "temprature: is not a field setflow reads here"}
        ws.send_json({**CREATE, "input": "x" * 5000})
        ev = error_event(ws)
        assert ev["status"] == 413 and ev["error"]["code"] == "too_large"
        ws.send_text('{"type": "response.create", "input": "\\ud800"}')
        assert "lone surrogate" in error_event(ws)["error"]["message"]
        for rid in ("resp_" + "0" * 24, "resp_does_not_exist"):  # before: 404 not_found (the suite's check failed)
            ws.send_json({**CREATE, "previous_response_id": rid})
            ev = error_event(ws)
            assert ev["status"] == 400 and ev["error"]["code"] == "previous_response_not_found", ev
            assert ev["error"]["param"] == "previous_response_id" and rid in ev["error"]["message"], ev
        assert api.snapshot() == before  # none of them wrote anything

        ws.send_json({**CREATE, "stream_id": "lane-2", "stream": True})  # stream: implied, taken
        created, in_progress = ws.receive_json(), ws.receive_json()
    assert (created["type"], created["sequence_number"], created["stream_id"]) == ("response.created", 0, "lane-2")
    assert (in_progress["type"], in_progress["sequence_number"]) == ("response.in_progress", 1)
    r = created["response"]
    assert r["status"] == "queued" and r["id"].startswith("resp_")
    assert api.job_count() == 1  # queued: no worker runs here; the socket closed and it stays (store true)


def test_a_socket_is_one_of_its_tenants_streams(make_api: Callable[..., Api]) -> None:
    api = make_api(max_streams_per_tenant=1)
    with api.http.websocket_connect("/v1/responses", headers=ACME):
        with pytest.raises(WebSocketDenialResponse) as e:
            with api.http.websocket_connect("/v1/responses", headers=ACME):
                pass
        assert e.value.status_code == 429 and e.value.json()["error"]["type"] == "rate_limit_error"
    with api.http.websocket_connect("/v1/responses", headers=ACME) as ws:  # its slot is free again
        ws.send_text("{}")
        assert error_event(ws)["error"]["param"] == "type"


def test_an_idle_socket_is_closed_with_a_reason(make_api: Callable[..., Api], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(response_socket, "IDLE_S", 0.2)
    api = make_api()
    with api.http.websocket_connect("/v1/responses", headers=ACME) as ws:
        with pytest.raises(WebSocketDisconnect) as e:
            ws.receive_text()
    assert e.value.code == 1000 and "no frame for" in str(e.value.reason) and "previous_response_id" in str(e.value.reason)


def test_another_sockets_store_false_response_is_not_found_and_a_stored_one_is_read_from_sql(
        make_api: Callable[..., Api]) -> None:
    """The spec's WebSocket continuation: store false has no persisted fallback (before: it was
    looked up in SQL like any response, and went on where its session was still there)."""
    api = make_api()
    with api.http.websocket_connect("/v1/responses", headers=ACME) as mine, \
            api.http.websocket_connect("/v1/responses", headers=ACME) as stored, \
            api.http.websocket_connect("/v1/responses", headers=ACME) as other:
        mine.send_json({**CREATE, "store": False})
        own = mine.receive_json()["response"]["id"]  # queued (no worker): it stays on `mine`
        stored.send_json(CREATE)
        kept = stored.receive_json()["response"]["id"]
        other.send_json({**CREATE, "store": False, "previous_response_id": own})
        ev = error_event(other)
        assert (ev["status"], ev["error"]["code"]) == (400, "previous_response_not_found"), ev
        assert "only on the socket that made it" in ev["error"]["message"], ev
        other.send_json({**CREATE, "previous_response_id": kept})  # store true: from SQL, on any socket
        ev = error_event(other)
        assert ev["error"]["code"] == "bad_input" and "only a completed one goes on" in ev["error"]["message"], ev


def test_a_socket_open_for_its_hour_gets_the_specs_error_then_is_closed(make_api: Callable[..., Api],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: closed (1000) with no error event; the spec asks for websocket_connection_limit_reached."""
    monkeypatch.setattr(response_socket, "MAX_AGE_S", 0.2)
    api = make_api()
    with api.http.websocket_connect("/v1/responses", headers=ACME) as ws:
        ev = error_event(ws)
        assert (ev["status"], ev["error"]["code"]) == (400, "websocket_connection_limit_reached"), ev
        with pytest.raises(WebSocketDisconnect) as e:
            ws.receive_text()
    assert e.value.code == 1000 and "previous_response_id" in str(e.value.reason)


def test_a_client_gone_mid_response_frees_its_stream_and_a_store_false_response_is_forgotten(
        make_api: Callable[..., Api]) -> None:
    api = make_api()
    with api.http.websocket_connect("/v1/responses", headers=ACME) as ws:
        ws.send_json({**CREATE, "store": False})
        job = ws.receive_json()["response"]["id"].removeprefix("resp_")

    def status() -> str:
        try:
            return str(api.svc.jobs.get(job).status)
        except NotFound:
            return "forgotten"

    deadline = time.monotonic() + 20
    while (api.svc.streams.get("acme", 0) or status() != "forgotten") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert api.svc.streams.get("acme", 0) == 0 and status() == "forgotten"  # cancelled, then deleted (as over SSE)
