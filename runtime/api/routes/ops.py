"""Operations: /healthz (Redis, the database, the live workers) and /metrics (Prometheus: turns
and their resume paths with timing histograms, checked output by outcome, jobs by kind and
status, queue depths, KV bytes in Redis per tenant).  Neither needs an API key: they carry no
session content; /metrics names tenants, so a deployment may require a token of its own for it
(SETFLOW_METRICS_TOKEN)."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from runtime.api.auth import Unauthorized
from runtime.api.deps import Svc
from runtime.api.models import ErrorResponse, Health
from runtime.api.services import Services
from runtime.jobs.routing import consumed_by, shared_queue
from runtime.replies import text as _text

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
def health(svc: Svc) -> Any:
    """200 when Redis and the database answer; the live workers are listed (none is not an
    error: jobs wait in their queues)."""
    try:
        ok_redis, workers = bool(svc.client.ping()), svc.dispatcher.routing.live_workers()
    except redis.RedisError:
        ok_redis, workers = False, []
    try:
        with svc.sql.connect() as c:
            c.execute(text("SELECT 1"))
        ok_db = True
    except SQLAlchemyError:
        ok_db = False
    h = Health(status="ok" if ok_redis and ok_db else "degraded", redis=ok_redis, database=ok_db, workers=workers)
    return JSONResponse(h.model_dump(), status_code=200 if h.status == "ok" else 503)


class _Collector(Collector):
    def __init__(self, svc: Services) -> None:
        self.svc = svc

    def collect(self) -> Iterator[Metric]:
        svc = self.svc
        m = svc.metrics.read()
        turns = CounterMetricFamily("setflow_turns", "Turns decoded, by how the session was resumed", labels=["path"])
        for path, n in sorted(m["turns"].items()):
            turns.add_metric([path], n)
        yield turns
        per_tenant = CounterMetricFamily("setflow_tenant_turns", "Turns decoded, by tenant", labels=["tenant"])
        for t, n in sorted(m["tenants"].items()):
            per_tenant.add_metric([t], n)
        yield per_tenant
        for kind, what in (("load", "loading the session (the resume itself)"), ("turn", "a whole turn")):
            h = HistogramMetricFamily(f"setflow_{kind}_seconds", f"Seconds spent {what}, by resume path",
                                      labels=["path"])
            for path, v in sorted(m[kind].items()):
                h.add_metric([path], v["buckets"], v["sum"])
            yield h
        checked = CounterMetricFamily("setflow_checked", "Checked job output (narratives, report sections, key "
                                      "figures, agent answers), by part and outcome", labels=["part", "outcome"])
        for part, outcomes in sorted(m["checked"].items()):
            for outcome, n in sorted(outcomes.items()):
                checked.add_metric([part, outcome], n)
        yield checked
        jobs = GaugeMetricFamily("setflow_jobs", "Jobs in the database, by kind and status", labels=["kind", "status"])
        for (k, s), n in sorted(svc.jobs.counts().items()):
            jobs.add_metric([k, s], n)
        yield jobs
        depth = GaugeMetricFamily("setflow_queue_depth", "Messages waiting in a Celery queue", labels=["queue"])
        queues = {shared_queue(svc.settings, "interactive"), shared_queue(svc.settings, "batch")}
        for w in svc.dispatcher.routing.live_workers():
            queues.update(consumed_by(svc.settings, w))
        for q in sorted(queues):
            depth.add_metric([q], svc.dispatcher.routing.depth(q))  # the broker's queue, Redis or RabbitMQ
        yield depth
        kv = GaugeMetricFamily("setflow_kv_bytes", "KV cache bytes held in Redis, by tenant", labels=["tenant"])
        for tenant, held in sorted(svc.client.hgetall(svc.keys.totals).items()):  # one hash: O(tenants)
            kv.add_metric([_text(tenant)], int(held))
        yield kv
        ev = GaugeMetricFamily("setflow_event_bytes", "Job event stream bytes held in Redis, by tenant (in its "
                               "budget with its KV bytes)", labels=["tenant"])
        for name, size in svc.dispatcher.events.all_tenant_bytes().items():
            ev.add_metric([name], size)
        yield ev


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}},
                                                           401: {"model": ErrorResponse}})
def metrics(svc: Svc, authorization: Annotated[str | None, Header()] = None) -> Response:
    """Prometheus text.  Per-tenant series name tenants: /metrics needs `Authorization: Bearer
    <SETFLOW_METRICS_TOKEN>`, unless SETFLOW_METRICS_PUBLIC opens it (a private network)."""
    token = svc.settings.metrics_token
    if token is None and not svc.settings.metrics_public:
        raise Unauthorized("/metrics is closed: set SETFLOW_METRICS_TOKEN (then send `Authorization: Bearer <it>`), "
                           "or SETFLOW_METRICS_PUBLIC=true on a private network")
    if token is not None and not hmac.compare_digest((authorization or "").encode(), f"Bearer {token}".encode()):
        raise Unauthorized("/metrics needs the metrics token: `Authorization: Bearer <SETFLOW_METRICS_TOKEN>`")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(svc))
    return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")
