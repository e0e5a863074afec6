"""API keys -> tenants.  A request names its key as `Authorization: Bearer KEY` or `X-API-Key:
KEY`; Settings.api_keys maps keys to tenants.  Every route takes the tenant from here (deps.py),
and every read and write is scoped to it: another tenant's session or job is a 404, never a 403
(its existence is not disclosed)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


class Unauthorized(Exception):
    code = "unauthorized"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyRing:
    """The API keys as SHA-256 digests -> tenant: the keys themselves are not kept, and a lookup
    hashes the presented key first, so its time says nothing about how close a guess came."""

    def __init__(self, api_keys: Mapping[str, str]) -> None:
        self._tenants = {_digest(k): t for k, t in api_keys.items()}

    def __len__(self) -> int:
        return len(self._tenants)

    def tenant(self, key: str) -> str | None:
        return self._tenants.get(_digest(key)) if key else None


def tenant_of(keys: KeyRing, headers: Mapping[str, str]) -> str:
    """The tenant whose key the headers name; Unauthorized for none or an unknown one."""
    auth = headers.get("authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key", "")
    tenant = keys.tenant(key)
    if tenant is None:
        raise Unauthorized("a valid API key is required: `Authorization: Bearer KEY` or `X-API-Key: KEY`")
    return tenant
