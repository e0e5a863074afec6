"""API keys -> tenants.  A request names its key as `Authorization: Bearer KEY` or `X-API-Key:
KEY`; Settings.api_keys maps keys to tenants.  Every route takes the tenant from here (deps.py),
and every read and write is scoped to it: another tenant's session or job is a 404, never a 403
(its existence is not disclosed)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping


class Unauthorized(Exception):
    code = "unauthorized"


def tenant_of(api_keys: Mapping[str, str], headers: Mapping[str, str]) -> str:
    """The tenant whose key the headers name; Unauthorized for none or an unknown one."""
    auth = headers.get("authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key", "")
    if key:
        for known, name in api_keys.items():
            if hmac.compare_digest(known.encode(), key.encode()):  # no timing hint of a near miss
                return name
    raise Unauthorized("a valid API key is required: `Authorization: Bearer KEY` or `X-API-Key: KEY`")
