"""Errors as HTTP: every error body is {"error": {"code", "message"[, "retry_after_s"]}} with a
stable code (runtime/errors.py's, plus unauthorized, too_large, no_model, unavailable and
store_full).  Request validation is a 422 that names each bad field; a rate limit is a 429 with
Retry-After; a store away or no model published yet is a 503 with Retry-After, and so is a
write Redis refused at its maxmemory (store_full: nothing of the request is kept; a submission
takes its rate-limit token, a Redis write, before its SQL row, so it writes nothing)."""

from __future__ import annotations

import logging
import math
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.api.auth import Unauthorized
from runtime.api.openai.ids import OPENAI_PATHS
from runtime.errors import SetflowError
from runtime.sessions.budget import oom

log = logging.getLogger("setflow.api")
STORE_FULL_RETRY_S = 30  # Retry-After of store_full: memory frees as idle sessions go and streams are compacted

STATUS = {"bad_input": 422, "not_found": 404, "busy": 409, "rate_limited": 429, "over_budget": 409,
          "stale_write": 409, "lease_lost": 409, "corrupt_state": 500, "cancelled": 409, "claim_lost": 409,
          "no_model": 503, "model_not_hosted": 409, "not_waiting": 409, "unknown_call": 404,
          "already_answered": 409, "deadline_passed": 409, "not_finished": 409}

HTTP_CODES = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "too_large",
              415: "unsupported_media_type", 422: "bad_input", 429: "rate_limited"}


#: on the routes of OpenAI's APIs (runtime/api/openai/ids.OPENAI_PATHS) an error is OpenAI's: its
#: `type` beside the code, `param`, and a bad request is a 400 (what OpenAI's SDKs raise BadRequestError for)
OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "invalid_request_error", 405: "invalid_request_error", 409: "invalid_request_error",
                413: "invalid_request_error", 415: "invalid_request_error", 429: "rate_limit_error"}
_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "message", "function_call", "function_call_output",
              "item_reference"}  # a union's branches (its types, an item's tag), as pydantic names them in a loc


def body(code: str, message: str, status: int, path: str = "", **extra: Any) -> JSONResponse:
    """The error's JSON; path: the request's (an OpenAI route's error is OpenAI's shape)."""
    if path.startswith(OPENAI_PATHS):
        status = 400 if status == 422 else status
        extra = {"type": OPENAI_TYPES.get(status, "server_error"), "param": None, **extra}
    headers = {}
    if extra.get("retry_after_s") is not None:
        headers["Retry-After"] = str(max(1, math.ceil(extra["retry_after_s"])))
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status, headers=headers)


def openai_invalid(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """A request's validation errors as OpenAI words one: a message naming one field and what is
    wrong with it, and that field as `param` (`input[0].content[1]`).  Of the errors, a rule's
    own (a ValueError's message) comes first, then the most specific (the deepest field): the
    branches pydantic tried and refused for a union (`input` is not a string) are not the error."""
    if not errors:
        return "invalid request", None
    def depth(err: dict[str, Any]) -> tuple[bool, int]:
        return err.get("type") == "value_error", len(_param_path(err["loc"]))
    err = max(errors, key=depth)
    param = _param(err["loc"])
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if err.get("type") == "missing":
        msg = "is required"
    elif err.get("type") in ("extra_forbidden",):
        msg = "is not a field setflow reads here"
    return (f"{param}: {msg}" if param else msg), param


def _param_path(loc: tuple[Any, ...] | list[Any]) -> list[Any]:
    """A loc without pydantic's union branches and the body's name."""
    out: list[Any] = []
    for x in loc[1:] if loc and loc[0] in ("body", "query", "path") else loc:
        if isinstance(x, str) and (x in _TYPE_TAGS or "[" in x or x[:1].isupper()):
            continue
        out.append(x)
    return out


def _param(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """`input[0].content[1]`: a loc as OpenAI's `param` writes a field."""
    out = ""
    for x in _param_path(loc):
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out or None


class Caught:
    """The outermost middleware: an exception no handler took is a JSON 500 (code "internal",
    the shape of every error) and one log line naming its type and route, never a traceback of
    the tenant's input; a response already started is closed as it is."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as e:
            if scope["type"] != "http":
                raise
            log.error("internal error on %s %s: %s", scope.get("method"), scope.get("path"), type(e).__name__)
            if not started:
                await body("internal", "the server failed on this request; it was logged", 500,
                           scope.get("path", ""))(scope, receive, send)


def install(app: FastAPI) -> None:
    @app.exception_handler(SetflowError)
    async def _setflow(r: Request, e: SetflowError) -> JSONResponse:
        return body(e.code, e.message, STATUS.get(e.code, 500), r.url.path,
                    retry_after_s=getattr(e, "retry_after_s", None))

    @app.exception_handler(Unauthorized)
    async def _unauthorized(r: Request, e: Unauthorized) -> JSONResponse:
        return body("unauthorized", str(e), 401, r.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(r: Request, e: RequestValidationError) -> JSONResponse:
        if r.url.path.startswith(OPENAI_PATHS):
            message, param = openai_invalid(list(e.errors()))
            return body("bad_input", message, 422, r.url.path, param=param)
        reasons = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        return body("bad_input", reasons or "invalid request", 422, r.url.path)

    @app.exception_handler(HTTPException)
    async def _http(r: Request, e: HTTPException) -> JSONResponse:
        # the framework's own refusals (no such route or method, a body that is not even text)
        # in the same shape as ours; a body that cannot be read is bad input like any other
        status = 422 if e.status_code == 400 else e.status_code
        code = HTTP_CODES.get(status, "http_error")
        out = body(code, str(e.detail), status, r.url.path)
        out.headers.update(e.headers or {})
        return out

    @app.exception_handler(redis.RedisError)
    async def _redis(r: Request, e: redis.RedisError) -> JSONResponse:
        if oom(e):
            log.warning("redis full: %s", e)
            return body("store_full", "the session store (Redis) is at its memory ceiling (maxmemory) and refused "
                        "the write; nothing was kept: retry later", 503, r.url.path, retry_after_s=STORE_FULL_RETRY_S)
        log.warning("redis unavailable: %s", e)
        return body("unavailable", "the session store (Redis) is unavailable; retry shortly", 503, r.url.path,
                    retry_after_s=1)

    @app.exception_handler(OperationalError)
    async def _database(r: Request, e: OperationalError) -> JSONResponse:
        log.warning("database unavailable: %s", e)
        return body("unavailable", "the database is unavailable; retry shortly", 503, r.url.path, retry_after_s=1)
