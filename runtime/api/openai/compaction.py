"""Compaction (OpenAI's POST /v1/responses/compact): a history made short enough to go on with,
as one opaque `compaction` item the client sends back as input.

What is kept: the history's messages (user, system, developer and assistant), as text, in
order, the latest ones whose text fits COMPACT_CHARS (the oldest dropped first; the last one
always, its end kept where it alone is longer).  What is dropped: function calls and their
outputs (the answers that read them are kept), the instructions (as OpenAI carries no
instructions to the next response), and a call still waiting for its output (so compact a
history that ends at an answer, or after the call's output has been answered).

The item's `encrypted_content` is those messages sealed with AES-256-GCM under a key derived
from the deployment's secret key, bound to the tenant: the client cannot read or edit it, and
another tenant's compaction opens nowhere.  An input item `compaction` is read as those
messages, where it stands, and the items before it are not read (it carries them); it is
expanded before anything else reads the input, so the next response starts a session of its own
over them: within the model's context, as COMPACT_CHARS bounds them.  The same item comes at the
head of a response's output where `context_management` compacted its chain (server side).

    sealed = "cmp1:" + base64url(nonce (12 random bytes) + AES-GCM(key, nonce,
                                 plaintext=JSON {"messages": [{"role", "text"}]}, aad="{tenant}/compaction"))
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runtime.errors import BadInput

PREFIX = "cmp1:"
LABEL = b"setflow/compaction/v1"  # the key is derived for this use only (HMAC-SHA256 of the secret key)
#: the kept messages' text, at most: about 1,000-1,300 tokens of English, half the shipped
#: model's 2,048 positions, so the next response's input and its answer fit beside them
COMPACT_CHARS = 4000
ROLES = ("user", "system", "developer", "assistant")


def kept(history: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The messages a compaction keeps of `history` (input items, as CreateResponse.items() and
    the stored items have them): each message's role and text, the latest whose text fits
    COMPACT_CHARS; calls and their outputs dropped."""
    messages = [{"role": x["role"], "text": text} for x in history
                if x["type"] == "message" and x.get("role") in ROLES and (text := message_text(x))]
    out: list[dict[str, str]] = []
    room = COMPACT_CHARS
    for m in reversed(messages):
        if len(m["text"]) > room:
            if not out:  # the last message alone is longer: its end
                out.append({"role": m["role"], "text": m["text"][-room:]})
            break
        out.append(m)
        room -= len(m["text"])
    return out[::-1]


def message_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def item(messages: list[dict[str, str]], tenant: str, secret_key: str | None) -> dict[str, Any]:
    """The compaction item holding `messages`, sealed for `tenant`."""
    return {"type": "compaction", "id": f"cmp_{secrets.token_hex(12)}",
            "encrypted_content": seal(messages, tenant, secret_key)}


def seal(messages: list[dict[str, str]], tenant: str, secret_key: str | None) -> str:
    nonce = os.urandom(12)
    box = AESGCM(_key(secret_key)).encrypt(nonce, json.dumps({"messages": messages}).encode(), _aad(tenant))
    return PREFIX + base64.urlsafe_b64encode(nonce + box).decode().rstrip("=")


def unseal(sealed: str, tenant: str, secret_key: str | None) -> list[dict[str, str]]:
    """The messages a compaction item holds; BadInput where it is not one this deployment sealed
    for this tenant (edited, another tenant's, another deployment's, or sealed under another key)."""
    refused = BadInput("a compaction item's encrypted_content is not one setflow made for this tenant "
                       "(POST /v1/responses/compact makes one): send it as it came back, or the history itself")
    if not sealed.startswith(PREFIX):
        raise refused
    try:
        body = sealed.removeprefix(PREFIX)
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        plain = AESGCM(_key(secret_key)).decrypt(raw[:12], raw[12:], _aad(tenant))
        messages = json.loads(plain)["messages"]
    except (binascii.Error, ValueError, InvalidTag, KeyError, TypeError):
        raise refused from None
    return [{"role": str(m["role"]), "text": str(m["text"])} for m in messages]


def expanded(items: list[dict[str, Any]], tenant: str, secret_key: str | None) -> list[dict[str, Any]]:
    """The input items from the latest compaction item on, that item read as the messages it
    holds, where it stands: it carries the history before it (a stateless client appends a
    response's output, a compaction item among it, to everything it sent before; what precedes
    the item is in it already)."""
    at = max((i for i, x in enumerate(items) if x["type"] == "compaction"), default=None)
    if at is None:
        return items
    return [*as_items(unseal(items[at]["encrypted_content"], tenant, secret_key)), *items[at + 1:]]


def as_items(messages: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Kept messages as input items: user, system and developer messages as input_text, an
    assistant's as output_text."""
    return [{"type": "message", "role": m["role"],
             "content": [{"type": "output_text" if m["role"] == "assistant" else "input_text", "text": m["text"]}]}
            for m in messages]


def _key(secret_key: str | None) -> bytes:
    if secret_key is None:
        raise BadInput("compaction needs the deployment's secret key (SETFLOW_SECRET_KEY), which seals its item: "
                       "none is set here; send the history as it is, or go on with previous_response_id")
    return hmac.new(secret_key.encode(), LABEL, hashlib.sha256).digest()


def _aad(tenant: str) -> bytes:
    return f"{tenant}/compaction".encode()
