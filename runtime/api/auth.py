"""API keys -> tenants.  A request names its key as `Authorization: Bearer KEY` or `X-API-Key:
KEY`; Settings.api_keys maps keys to tenants.  Every route below takes the tenant from here,
and every read and write is scoped to it: another tenant's session or job is a 404, never a 403
(its existence is not disclosed)."""

from __future__ import annotations

import hmac

from fastapi import Request

from runtime.api.services import Services


class Unauthorized(Exception):
    code = "unauthorized"


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


def tenant(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
    if key:
        for known, name in services(request).settings.api_keys.items():
            if hmac.compare_digest(known.encode(), key.encode()):  # no timing hint of a near miss
                return name
    raise Unauthorized("a valid API key is required: `Authorization: Bearer KEY` or `X-API-Key: KEY`")
