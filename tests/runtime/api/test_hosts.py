"""The API binds a new session to a model a live worker hosts, and refuses (409
model_not_hosted, nothing written) a job for a model or numerics nobody hosts."""

from __future__ import annotations

from runtime.jobs.hosts import Host, Hosts
from runtime.sessions.engine import FP_LEN
from tests.runtime.api.conftest import ACME, TURN, Api, shipped_card


def test_a_job_runs_on_a_hosted_model_and_one_nobody_hosts_is_refused(api: Api) -> None:
    card = shipped_card()
    host = Host(card.config.name, card.fingerprint[:FP_LEN], "cpu/float32")
    Hosts(api.r, api.s).beat("w1", host)  # as a worker's runtime says it, with its heartbeat
    before = api.snapshot()
    for ask, why in (({"model": "llama"}, "llama"), ({"numerics": "cuda/bfloat16"}, "cuda/bfloat16")):
        r = api.http.post("/v1/jobs", headers=ACME, json={"kind": "turn", "spec": TURN, **ask})
        assert r.status_code == 409, r.text
        err = r.json()["error"]
        assert err["code"] == "model_not_hosted" and why in err["message"] and "small (cpu/float32)" in err["message"]
    assert api.snapshot() == before  # refused: no job, no session (a token paid: it checked after the rate limit)
    r = api.http.post("/v1/jobs", headers=ACME, json={"kind": "turn", "spec": TURN})
    assert r.status_code == 202, r.text
    job = api.svc.jobs.get(r.json()["id"])
    rec = api.svc.records.get_session(job.session_id or "", "acme")
    assert (rec.model, rec.numerics, rec.model_fingerprint) == (host.model, host.numerics, host.fingerprint)
    assert job.pool == host.pool and job.queue == api.svc.dispatcher.routing.shared("interactive", host.pool)
    again = api.http.post("/v1/jobs", headers=ACME, json={"kind": "turn", "spec": TURN, "session": rec.id,
                                                          "model": "other"})
    assert again.status_code == 422 and "runs model small" in again.json()["error"]["message"]
