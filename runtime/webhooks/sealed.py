"""Webhook signing secrets at rest: sealed with AES-256-GCM under the deployment's secret_key
(SETFLOW_SECRET_KEY), so a copy of the database (a dump, a backup, a replica's disk) cannot sign
a tenant's webhooks.

    stored = "sealed1:" + base64url(AES-GCM(key, nonce=the endpoint id's 12 random bytes,
                                            plaintext=the secret's 24 bytes,
                                            associated data="{tenant}/{endpoint id}"))

62 characters: the column's 64 hold it, no migration.  The nonce is the endpoint id's own
random bytes: a secret is sealed once per endpoint id (sealing the same secret again gives the
same text, which tells nothing), so a new secret for an endpoint needs a new id.  The associated
data binds a sealed secret to its row: copied to another endpoint it opens nowhere.  A secret
kept in the clear (written before secret_key was set, or with none set) reads as it is, and the
workers seal it once a key is set (WebhookSender.seal_clear)."""

from __future__ import annotations

import base64
import hashlib
import hmac

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

PREFIX = "sealed1:"
CLEAR = "whsec_"  # a secret in the clear, as Standard Webhooks writes one
LABEL = b"setflow/webhook-secrets/v1"  # the key is derived for this use only (HMAC-SHA256 of the setting)


class Unsealable(Exception):
    """A sealed secret that does not open: no secret_key, another one, or a row it was not sealed for."""


def key_of(secret_key: str | None) -> bytes | None:
    """The AES-256 key derived from the deployment's secret_key; None where none is set."""
    return None if secret_key is None else hmac.new(secret_key.encode(), LABEL, hashlib.sha256).digest()


def seal(secret: str, tenant: str, endpoint_id: str, key: bytes | None) -> str:
    """What the database keeps of `secret`: sealed under `key`, or as it is where key is None."""
    if key is None:
        return secret
    raw = base64.b64decode(secret.removeprefix(CLEAR))
    box = AESGCM(key).encrypt(_nonce(endpoint_id), raw, f"{tenant}/{endpoint_id}".encode())
    return PREFIX + base64.urlsafe_b64encode(box).decode().rstrip("=")


def unseal(stored: str, tenant: str, endpoint_id: str, key: bytes | None) -> str:
    """The secret (whsec_...) a stored value holds; Unsealable where it does not open."""
    if not stored.startswith(PREFIX):
        return stored  # kept in the clear
    if key is None:
        raise Unsealable("a webhook secret is sealed and no secret_key is set (SETFLOW_SECRET_KEY)")
    box = base64.urlsafe_b64decode(stored.removeprefix(PREFIX) + "==")
    try:
        raw = AESGCM(key).decrypt(_nonce(endpoint_id), box, f"{tenant}/{endpoint_id}".encode())
    except InvalidTag:
        raise Unsealable("a webhook secret does not open with this secret_key (was it changed?)") from None
    return CLEAR + base64.b64encode(raw).decode()


def _nonce(endpoint_id: str) -> bytes:
    """The endpoint id's 12 random bytes ("we_" + 24 hex)."""
    return bytes.fromhex(endpoint_id.removeprefix("we_"))
