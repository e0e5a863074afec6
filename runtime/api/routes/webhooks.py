"""/v1/webhooks: a tenant's endpoints for its jobs' endings (runtime/webhooks/endpoints.py): create
(its signing secret shown then, once: never kept with an Idempotency-Key's answer, so a replay
answers without it), list, read (with its deliveries' counts), delete."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from runtime.api import idempotency, scope
from runtime.api.deps import Limit, Svc, Tenant
from runtime.api.models import ERRORS, Utc
from runtime.settings import deployment_key
from runtime.tables import WebhookEndpointRecord
from runtime.webhooks import endpoints, outbox
from runtime.webhooks.endpoints import Endpoints

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])
EndpointId = Annotated[str, Path(pattern=f"^{endpoints.ENDPOINT_ID.pattern}$")]
EventType = Literal["job.succeeded", "job.failed", "job.cancelled",
                    "response.completed", "response.incomplete", "response.failed", "response.cancelled", "report.ready"]
assert get_args(EventType) == outbox.EVENT_TYPES, "the API's event types are the sender's"


class WebhookCreate(BaseModel):
    """A receiver of the tenant's job endings; no `events`: every type."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1, max_length=endpoints.MAX_URL, description="http or https")
    events: list[EventType] = Field(default_factory=list, max_length=len(outbox.EVENT_TYPES))
    description: str = Field(default="", max_length=512)


class WebhookView(BaseModel):
    """An endpoint as listed: never its secret."""

    id: str
    url: str
    events: list[str]
    description: str
    created_at: Utc


class WebhookCreated(WebhookView):
    """As created: with the secret that signs its messages, shown this once."""

    secret: str


class Deliveries(BaseModel):
    pending: int  # to send, or being retried
    delivered: int
    failed: int  # retries ran out (webhook_retry_for_s)


class WebhookDetail(WebhookView):
    deliveries: Deliveries


class WebhookList(BaseModel):
    webhooks: list[WebhookView]


def _store(svc: Svc) -> Endpoints:
    return Endpoints(svc.sql, svc.settings.tenant_max_webhooks, svc.settings.webhook_allow_private,
                     deployment_key(svc.settings))


def _view(r: WebhookEndpointRecord) -> WebhookView:
    return WebhookView(id=r.id, url=endpoints.shown(r.url), events=r.events, description=r.description, created_at=r.created_at)


@router.post("", status_code=201, response_model=WebhookCreated, responses=ERRORS)
def create_webhook(req: WebhookCreate, who: Tenant, svc: Svc, request: Request, response: Response) -> WebhookCreated:
    """Register an endpoint.  Its `secret` (whsec_...) signs every message in the Standard
    Webhooks format; it is in this answer only: an Idempotency-Key keeps this answer without it,
    and its replay has no `secret`.  A url that is not http(s), an unknown event type: 422; past
    tenant_max_webhooks endpoints: 409 over_budget.  Nothing written then."""
    if idempotency.HEADER in request.headers:  # the middleware keeps this answer: not its secret
        response.headers[scope.UNKEPT] = "secret"
    rec = _store(svc).create(who, req.url, req.events, req.description)
    return WebhookCreated(**_view(rec).model_dump(), secret=rec.secret)


@router.get("", response_model=WebhookList, responses=ERRORS)
def list_webhooks(who: Tenant, svc: Svc, limit: Limit = 50) -> WebhookList:
    """The tenant's endpoints, oldest first."""
    return WebhookList(webhooks=[_view(r) for r in _store(svc).listing(who, limit)])


@router.get("/{webhook_id}", response_model=WebhookDetail, responses=ERRORS)
def get_webhook(webhook_id: EndpointId, who: Tenant, svc: Svc) -> WebhookDetail:
    store = _store(svc)
    view = _view(store.get(who, webhook_id))
    return WebhookDetail(**view.model_dump(), deliveries=Deliveries(**store.deliveries(who, webhook_id)))


@router.delete("/{webhook_id}", status_code=204, responses=ERRORS)
def delete_webhook(webhook_id: EndpointId, who: Tenant, svc: Svc) -> Response:
    """Its messages not yet delivered are dropped, never sent."""
    _store(svc).delete(who, webhook_id)
    return Response(status_code=204)
