"""/v1/conversations: OpenAI's conversations over setflow's sessions.  A conversation is a
session: its responses run on it one after another, each restoring its K/V from Redis (or warm
on the worker that ran the last).  Items added to it are read by its next response.

    POST   /v1/conversations                  create (with items and metadata)
    GET    /v1/conversations/{id}             get
    POST   /v1/conversations/{id}             update its metadata
    DELETE /v1/conversations/{id}             delete (its session: turns, K/V, responses)
    GET    /v1/conversations/{id}/items       its items: each response's input and output, and those added
    POST   /v1/conversations/{id}/items       add items
    GET    /v1/conversations/{id}/items/{item}   one item
    DELETE /v1/conversations/{id}/items/{item}   take out an item no response has read yet
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from runtime.api.deps import Svc, Tenant
from runtime.api.models import ERRORS
from runtime.api.openai import ids, mapping, view
from runtime.api.openai.chain import referenced
from runtime.api.openai.request import CreateResponse, Item
from runtime.api.routes.sessions import delete_whole
from runtime.api.services import Services
from runtime.errors import BadInput, Busy, NotFound
from runtime.jobs.conversations import Conversations
from runtime.tables import ConversationRecord

router = APIRouter(prefix="/v1/conversations", tags=["conversations"])
ConversationId = Annotated[str, Path(pattern=r"^conv_[A-Za-z0-9_-]{1,64}$")]
ItemId = Annotated[str, Path(min_length=1, max_length=128)]
Metadata = dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]]


class CreateConversation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[Item] = Field(default_factory=list, max_length=20)
    metadata: Metadata | None = Field(default=None, max_length=16)


class AddItems(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[Item] = Field(min_length=1, max_length=20)


class UpdateConversation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: Metadata = Field(max_length=16)


def _items(items: list[Any]) -> list[dict[str, Any]]:
    """Items as a response's input stores them (runtime/api/openai/request.CreateResponse.items)."""
    return CreateResponse(input=items).items() if items else []


def _view(rec: ConversationRecord) -> dict[str, Any]:
    return {"id": ids.conversation_id(rec.session_id), "object": "conversation",
            "created_at": int(rec.created_at.timestamp()) if rec.created_at else 0, "metadata": rec.meta or {}}


def _readable(svc: Services, who: str, session: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`items`, once checked that the conversation's next response can read them with those it
    holds unread: BadInput otherwise, rather than a conversation whose every next response is
    refused (and no way to take an item back).  A function_call_output answers a call its last
    response waits for, once; the messages' text fits one input (4 x max_input_tokens).  An
    item_reference is kept as the item it names (NotFound where it names none)."""
    items = referenced(svc, who, items)
    convs = Conversations(svc.sql, svc.settings)
    pending = list(convs.get(session, who).pending) if session is not None else []
    done = convs.responses(session) if session is not None else []
    waiting = mapping.waiting_calls(done[-1] if done else None)
    answered = [x["call_id"] for x in [*pending, *items] if x["type"] == "function_call_output"]
    if bad := [c for c in answered if c not in waiting or answered.count(c) > 1]:
        raise BadInput(f"no call of this conversation waits for an output, or it has one already: {sorted(set(bad))}")
    text, most = sum(len(mapping.message_text(x)) for x in [*pending, *items] if x["type"] == "message"), \
        4 * svc.settings.max_input_tokens
    if text > most:
        raise BadInput(f"the conversation's unread items would hold {text} characters of text; its next response "
                       f"reads at most {most}")
    return items


@router.post("", responses=ERRORS)
def create_conversation(body: CreateConversation, who: Tenant, svc: Svc) -> JSONResponse:
    items = _readable(svc, who, None, _items(body.items))
    svc.limiter.take(who)
    return JSONResponse(_view(Conversations(svc.sql, svc.settings).create(who, body.metadata or {}, items)))


@router.get("/{conversation_id}", responses=ERRORS)
def get_conversation(conversation_id: ConversationId, who: Tenant, svc: Svc) -> JSONResponse:
    return JSONResponse(_view(Conversations(svc.sql, svc.settings).get(ids.session_of(conversation_id), who)))


@router.post("/{conversation_id}", responses=ERRORS)
def update_conversation(conversation_id: ConversationId, body: UpdateConversation, who: Tenant, svc: Svc
                        ) -> JSONResponse:
    convs, session = Conversations(svc.sql, svc.settings), ids.session_of(conversation_id)
    convs.set_meta(session, who, body.metadata)
    return JSONResponse(_view(convs.get(session, who)))


@router.delete("/{conversation_id}", responses=ERRORS)
def delete_conversation(conversation_id: ConversationId, who: Tenant, svc: Svc) -> JSONResponse:
    """Delete the conversation with its session (turns, K/V) and its responses; 409 busy while a
    response of it runs (cancel it first)."""
    session = ids.session_of(conversation_id)
    Conversations(svc.sql, svc.settings).get(session, who)  # NotFound first
    if svc.records.unfinished_jobs(session):
        raise Busy(f"conversation {conversation_id} has a response in progress; cancel it first")
    svc.limiter.take(who)
    delete_whole(svc, session, who)
    return JSONResponse({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


@router.get("/{conversation_id}/items", responses=ERRORS)
def list_items(conversation_id: ConversationId, who: Tenant, svc: Svc,
               limit: Annotated[int, Query(ge=1, le=100)] = 20, order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
               after: Annotated[str | None, Query(max_length=128)] = None) -> JSONResponse:
    """Each response's input items and output items, in order, then the items added since."""
    read, unread = _all_items(svc, who, ids.session_of(conversation_id))
    return JSONResponse(view.page(read + unread, limit, order, after))


def _all_items(svc: Services, who: str, session: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the items its responses read and wrote, in order; the items added that none has read)."""
    convs = Conversations(svc.sql, svc.settings)
    rec = convs.get(session, who)  # NotFound for another tenant's
    read: list[dict[str, Any]] = []
    for job in convs.responses(session):
        read += view.input_items(job) + view.output_items(job)
    return read, list(rec.pending)


@router.get("/{conversation_id}/items/{item_id}", responses=ERRORS)
def get_item(conversation_id: ConversationId, item_id: ItemId, who: Tenant, svc: Svc) -> JSONResponse:
    read, unread = _all_items(svc, who, ids.session_of(conversation_id))
    if (item := next((x for x in read + unread if x["id"] == item_id), None)) is None:
        raise NotFound(f"no item {item_id!r} in conversation {conversation_id}")
    return JSONResponse(item)


@router.delete("/{conversation_id}/items/{item_id}", responses=ERRORS)
def delete_item(conversation_id: ConversationId, item_id: ItemId, who: Tenant, svc: Svc) -> JSONResponse:
    """Take out an item no response has read; the conversation, as OpenAI answers.  An item a
    response read (or wrote) stays: its tokens are in the conversation's K/V and every later
    response was decoded after them (400; branch with previous_response_id from an earlier one)."""
    session = ids.session_of(conversation_id)
    read, _ = _all_items(svc, who, session)
    if any(x["id"] == item_id for x in read):
        raise BadInput(f"item {item_id!r} was read by a response of {conversation_id}: its tokens are in the "
                       "conversation's cache; branch from an earlier response with previous_response_id instead")
    svc.limiter.take(who)
    convs = Conversations(svc.sql, svc.settings)
    convs.remove(session, who, item_id)
    return JSONResponse(_view(convs.get(session, who)))


@router.post("/{conversation_id}/items", responses=ERRORS)
def add_items(conversation_id: ConversationId, body: AddItems, who: Tenant, svc: Svc) -> JSONResponse:
    """Add items; the conversation's next response reads them before its own input."""
    session = ids.session_of(conversation_id)
    items = _readable(svc, who, session, _items(body.items))
    svc.limiter.take(who)
    added = Conversations(svc.sql, svc.settings).add(session, who, items)
    return JSONResponse({"object": "list", "data": added, "first_id": added[0]["id"], "last_id": added[-1]["id"],
                         "has_more": False})
