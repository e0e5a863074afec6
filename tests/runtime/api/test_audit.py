"""Audit points of the bounded-state issue on the API: each was accepted, or exposed, before."""

from __future__ import annotations

from tests.runtime.api.conftest import ACME, Api


def test_text_with_a_nul_is_refused_at_submission_and_changes_nothing(api: Api) -> None:
    sid = api.seed_session("acme", turns=1)
    before = api.snapshot(rate_limits=True)
    for path, body in ((f"/v1/sessions/{sid}/turns", {"text": "revenue: up\x00\n"}),
                       ("/v1/jobs", {"kind": "turn", "session": sid, "spec": {"text": "a\x00b"}}),
                       ("/v1/jobs", {"kind": "infill", "session": sid, "spec": {"text": "x <hole> \x00"}})):
        r = api.http.post(path, headers=ACME, json=body)
        assert r.status_code == 422 and r.json()["error"]["code"] == "bad_input", r.text
        assert "NUL" in r.text
    assert api.snapshot(rate_limits=True) == before  # no job, no session, no token


def test_the_stream_cap_is_checked_where_a_stream_is_counted(api: Api) -> None:
    """Streams that passed the route's check together: the one that would go over the cap, at
    the moment it would be counted, says so and ends, counted never."""
    import asyncio

    from runtime.api.routes.jobs import _stream

    cap = api.svc.settings.max_streams_per_tenant
    api.svc.streams["acme"] = cap  # the others opened between this stream's check and its start

    async def first() -> str:
        gen = _stream(api.svc, "acme", "0" * 24, "0")
        out = await anext(gen)
        await gen.aclose()
        return out

    out = asyncio.run(first())
    assert out.startswith("event: error") and '"code":"rate_limited"' in out
    assert api.svc.streams["acme"] == cap, "not counted"
