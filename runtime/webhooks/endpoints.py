"""A tenant's webhook endpoints: the URL each message goes to (public addresses only, unless
webhook_allow_private: runtime/webhooks/transport.py, no request from inside the deployment's
network on a tenant's behalf), the event types it takes, and the secret that signs its messages,
kept sealed at rest (runtime/webhooks/sealed.py).  Knows nothing of workers or routes."""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

import httpx
from sqlalchemy import Engine, case, delete, func, select
from sqlalchemy.orm import sessionmaker

from runtime.db import writer
from runtime.errors import BadInput, NotFound, OverBudget
from runtime.tables import WebhookEndpointRecord, listing, owned
from runtime.webhooks.outbox import EVENT_TYPES, M, matched_rows
from runtime.webhooks.sealed import key_of, seal
from runtime.webhooks.transport import public

ENDPOINT_ID = re.compile(r"we_[0-9a-f]{24}")
MAX_URL = 2048


def new_secret() -> str:
    """A signing secret as Standard Webhooks writes one: "whsec_" + base64 of 24 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def check_url(url: str, allow_private: bool = False) -> str:
    """An absolute http(s) URL of at most MAX_URL characters whose host is not a non-public
    address (unless allow_private), or BadInput.  A name is resolved at each delivery instead
    (transport.Guarded): what it resolves to may change."""
    if not isinstance(url, str) or not 0 < len(url) <= MAX_URL:
        raise BadInput(f"a webhook url is 1..{MAX_URL} characters")
    try:
        u = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as e:
        raise BadInput(f"a webhook url is an http or https URL: {e}") from None
    if u.scheme not in ("http", "https") or not u.host:
        raise BadInput(f"a webhook url is an absolute http or https URL, not {url[:100]!r}")
    if u.port is not None and not 0 < u.port < 65536:
        raise BadInput(f"a webhook url's port is 1..65535, not {u.port}")
    if not allow_private and (u.host.lower().rstrip(".") == "localhost" or u.host.lower().endswith(".localhost")
                              or not public(u.host, named=True)):
        raise BadInput(f"a webhook url reaches public addresses only, not {u.host!r} (a loopback, private or "
                       "link-local address: the deployment allows these with webhook_allow_private)")
    return url


def shown(url: str) -> str:
    """A url as views list it: a password in it (https://user:pw@host/...) as "***"."""
    u = httpx.URL(url)
    return str(u.copy_with(username=u.username, password="***")) if u.password else url


def check_events(events: Iterable[str]) -> list[str]:
    """Known event types, each once, in the order given; BadInput naming the unknown ones."""
    events = list(dict.fromkeys(events))
    unknown = [e for e in events if e not in EVENT_TYPES]
    if unknown:
        raise BadInput(f"unknown event types {unknown}: known are {', '.join(EVENT_TYPES)}")
    return events


class Endpoints:
    """A tenant's webhook endpoints: another tenant's look unknown (NotFound).  Their secrets are
    kept sealed under secret_key where one is given (runtime/webhooks/sealed.py)."""

    def __init__(self, engine: Engine, max_per_tenant: int = 10, allow_private: bool = False,
                 secret_key: str | None = None) -> None:
        self._db = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(writer(engine), expire_on_commit=False)
        self.max_per_tenant = max_per_tenant
        self.allow_private = allow_private
        self.key = key_of(secret_key)

    def create(self, tenant: str, url: str, events: Sequence[str] = (), description: str = "") -> WebhookEndpointRecord:
        """A new endpoint with a new secret, returned here in the clear and only here (the row
        keeps it sealed, where there is a key); BadInput for a bad url or
        event type, OverBudget past max_per_tenant (concurrent creations may pass it by one
        each: the count and the insert are one transaction): nothing written then."""
        url, events = check_url(url, self.allow_private), check_events(events)
        if len(description) > 512:
            raise BadInput("a webhook's description is at most 512 characters")
        with self._write.begin() as db:
            have = int(db.scalar(select(func.count()).select_from(WebhookEndpointRecord)
                                 .where(WebhookEndpointRecord.tenant == tenant)) or 0)
            if have >= self.max_per_tenant:
                raise OverBudget(f"tenant {tenant!r} has {have} webhook endpoints, the most it may have "
                                 "(tenant_max_webhooks): delete one first")
            endpoint_id, secret = f"we_{secrets.token_hex(12)}", new_secret()
            rec = WebhookEndpointRecord(id=endpoint_id, tenant=tenant, url=url, events=events, description=description,
                                        secret=seal(secret, tenant, endpoint_id, self.key), created_at=datetime.now(UTC))
            db.add(rec)
        rec.secret = secret  # the caller's copy only: the session is closed, nothing writes it
        return rec

    def get(self, tenant: str, endpoint_id: str) -> WebhookEndpointRecord:
        with self._db() as db:
            rec = db.get(WebhookEndpointRecord, endpoint_id) if ENDPOINT_ID.fullmatch(endpoint_id) else None
        return owned(rec, tenant, f"webhook endpoint {endpoint_id!r}")

    def listing(self, tenant: str, limit: int = 50) -> list[WebhookEndpointRecord]:
        """The tenant's endpoints, oldest first."""
        with self._db() as db:
            return list(db.scalars(listing(WebhookEndpointRecord, tenant, limit)))

    def deliveries(self, tenant: str, endpoint_id: str) -> dict[str, int]:
        """The endpoint's messages: pending (to send, or being retried), delivered, failed."""
        self.get(tenant, endpoint_id)
        with self._db() as db:
            total, delivered, failed = db.execute(select(
                func.count(), func.sum(case((M.delivered_at.is_not(None), 1), else_=0)),
                func.sum(case((M.failed_at.is_not(None), 1), else_=0))).where(M.endpoint_id == endpoint_id)).one()
        return {"pending": int(total) - int(delivered or 0) - int(failed or 0), "delivered": int(delivered or 0),
                "failed": int(failed or 0)}

    def delete(self, tenant: str, endpoint_id: str) -> int:
        """Delete the endpoint and its messages (those pending are never sent); returns how
        many messages went.  A job ending at the same moment may still write one for it: the
        sender drops that one."""
        self.get(tenant, endpoint_id)
        with self._write.begin() as db:
            gone = db.execute(delete(WebhookEndpointRecord).where(WebhookEndpointRecord.id == endpoint_id,
                                                                  WebhookEndpointRecord.tenant == tenant))
            if not matched_rows(gone):
                raise NotFound(f"no webhook endpoint {endpoint_id!r} for tenant {tenant!r}")
            return matched_rows(db.execute(delete(M).where(M.endpoint_id == endpoint_id)))
