"""A job's view says who holds it now (`worker`: only while it runs) apart from who ran it last
(`last_worker`): a waiting or re-queued job names no worker, since none holds it."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from runtime.tables import JobRecord
from tests.runtime.api.conftest import ACME, NARRATIVE, Api


@pytest.mark.parametrize(("status", "holds"), [("running", True), ("queued", False), ("requires_action", False),
                                               ("succeeded", False), ("failed", False)])
def test_worker_is_who_holds_the_job_now_and_last_worker_who_ran_it(api: Api, status: str, holds: bool) -> None:
    job = api.http.post("/v1/jobs", json={"kind": "narrative", "spec": NARRATIVE}, headers=ACME).json()
    assert job["worker"] is None and job["last_worker"] is None  # queued, never run
    with api.svc.sql.begin() as c:  # as a worker leaves it: w1 ran it, and it is now `status`
        c.execute(update(JobRecord).where(JobRecord.id == job["id"]).values(status=status, worker="w1"))
    view = api.http.get(f"/v1/jobs/{job['id']}", headers=ACME).json()
    assert (view["worker"], view["last_worker"]) == ("w1" if holds else None, "w1")


def test_times_read_back_say_they_are_utc(api: Api) -> None:
    """A dataset's PUT answered "...Z", its GET, and every job's times, the same time with no
    zone (SQLite keeps none; JavaScript reads such a time as local)."""
    job = api.http.post("/v1/jobs", json={"kind": "narrative", "spec": NARRATIVE}, headers=ACME).json()
    assert job["created_at"].endswith("Z")
    assert api.http.get(f"/v1/jobs/{job['id']}", headers=ACME).json()["created_at"].endswith("Z")
    csv = "metric,region,period,value\nrevenue,EMEA,2026-Q3,1\n"
    put = api.http.put("/v1/datasets/t", content=csv, headers={**ACME, "Content-Type": "text/csv"}).json()
    got = api.http.get("/v1/datasets/t", headers=ACME).json()
    assert put["updated_at"].endswith("Z") and got["updated_at"] == put["updated_at"], (put, got)
