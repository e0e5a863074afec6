"""The Responses API's ids: a response is `resp_<job id>`, a conversation `conv_<session id>`; an
output item is named after its response and its place (`msg_<job>_<i>`, `fc_<job>_<i>`), a call
after its response and the agent's call (`call_<job>_<n>`), so every read names them alike."""

from __future__ import annotations

import re

from runtime.errors import BadInput, NotFound

#: the routes whose errors and ids are OpenAI's (runtime/api/errors.py)
OPENAI_PATHS = ("/v1/responses", "/v1/conversations", "/v1/models")
RESPONSE_ID = re.compile(r"resp_([0-9a-f]{24})")
CONVERSATION_ID = re.compile(r"conv_([A-Za-z0-9_-]{1,64})")
CALL_ID = re.compile(r"call_([0-9a-f]{24})_([0-9]{1,3})")
MESSAGE_ID = re.compile(r"msg_([0-9a-f]{24})_([0-9]{1,3})")
ITEM_ID = re.compile(r"(?:msg|fc|in)_([0-9a-f]{24})_([0-9]{1,3})")  # an output item (msg_, fc_) or an input item (in_)


def response_id(job_id: str) -> str:
    return f"resp_{job_id}"


def job_of(rid: str) -> str:
    """A response id's job; NotFound where it names none: an id of any other form is one no
    response has (as OpenAI answers an unknown id, whatever its form)."""
    m = RESPONSE_ID.fullmatch(rid)
    if m is None:
        raise NotFound(f"no response {rid[:80]!r}")
    return m[1]


def conversation_id(session: str) -> str:
    return f"conv_{session}"


def session_of(cid: str) -> str:
    m = CONVERSATION_ID.fullmatch(cid)
    if m is None:
        raise BadInput(f"{cid!r} is not a conversation id (conv_...)")
    return m[1]
