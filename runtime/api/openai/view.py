"""A response job's row -> the Responses API's response object and its input and output items,
each named after the response and its place (ids.py names the ids).  Reads a
job row; knows nothing of the request's validation nor of the stream."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from model.params import DecodeParams
from runtime.api.openai.ids import response_id
from runtime.errors import BadInput
from runtime.jobs.hosts import pool_model
from runtime.tables import JobRecord


def status(job: JobRecord) -> str:
    """queued, in_progress, completed, incomplete, failed or cancelled."""
    if job.status == "succeeded":
        return str((job.result or {}).get("status", "completed"))
    return {"queued": "queued", "running": "in_progress", "requires_action": "in_progress",
            "failed": "failed", "cancelled": "cancelled"}[job.status]


def output_items(job: JobRecord) -> list[dict[str, Any]]:
    """The response's output, each item named after the response and its place; first, the
    compaction item where context_management compacted its chain (compaction.py)."""
    made = job.spec.get("request", {}).get("compaction")
    out = [made] if made is not None else []
    for i, x in enumerate((job.result or {}).get("output", [])):
        if x["type"] == "message":
            out.append({"type": "message", "id": f"msg_{job.id}_{i}", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": x["text"], "annotations": [], "logprobs": []}]})
        else:
            out.append({"type": "function_call", "id": f"fc_{job.id}_{i}", "status": "completed",
                        "call_id": f"call_{job.id}_{x['call'].removeprefix('call_')}", "name": x["name"],
                        "arguments": x["arguments"]})
    return out


#: what a response samples with where the request names no temperature (DecodeParams' default: greedy)
DEFAULT_TEMPERATURE = DecodeParams.temperature


def view(job: JobRecord, *, snapshot: str | None = None) -> dict[str, Any]:
    """The response object of `job`, with every field OpenAI's (and the Open Responses spec's)
    response object requires, each typed as they type it: what the request set, echoed; what it
    left out, the value that ran (temperature 0: greedy; top_p 1, no penalties; service_tier
    "default"); what setflow does not have, null (reasoning, completed_at before the end).
    snapshot: the status a stream event shows (a stream's events are the same on every read:
    none carries what the job became since)."""
    req: dict[str, Any] = job.spec.get("request", {})
    res = job.result or {}
    st = snapshot or status(job)
    final = snapshot is None or snapshot in ("completed", "incomplete", "failed", "cancelled")
    usage = res.get("usage") if final else None
    # the model that ran it, as OpenAI's name theirs, whatever the request asked ("gpt-4o" runs on the default)
    return {
        "id": response_id(job.id), "object": "response", "created_at": _ts(job.created_at), "status": st,
        "background": bool(req.get("background")), "model": pool_model(job.pool) or req.get("model") or "",
        "store": req.get("store", True),
        "output": output_items(job) if final else [],
        "error": ({"code": (job.error or {}).get("code", "server_error"), "message": (job.error or {}).get("message", "")}
                  if st == "failed" else None),
        "incomplete_details": {"reason": res.get("incomplete") or "max_output_tokens"} if st == "incomplete" else None,
        "instructions": req.get("instructions"), "metadata": req.get("metadata") or {},
        "tools": [echoed(t) for t in req.get("tools", [])], "tool_choice": req.get("tool_choice", "auto"),
        "parallel_tool_calls": False, "temperature": req.get("temperature", DEFAULT_TEMPERATURE), "top_p": 1.0,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "top_logprobs": req.get("top_logprobs", 0),
        "reasoning": req.get("reasoning"), "user": req.get("user"), "max_tool_calls": req.get("max_tool_calls"),
        "service_tier": "default", "safety_identifier": req.get("safety_identifier"),
        "prompt_cache_key": req.get("prompt_cache_key"), "prompt_cache_retention": req.get("prompt_cache_retention"),
        "completed_at": _ts(job.finished_at) if final and st == "completed" else None,
        "max_output_tokens": req.get("max_output_tokens"), "previous_response_id": req.get("previous_response_id"),
        "conversation": {"id": req["conversation"]} if req.get("conversation") else None,
        "text": {"format": (req.get("text") or {}).get("format") or {"type": "text"}}, "truncation": "disabled",
        "usage": None if usage is None else {
            "input_tokens": usage["input"], "input_tokens_details": {"cached_tokens": usage["cached"]},
            "output_tokens": usage["output"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["input"] + usage["output"]},
        "setflow": {"job": job.id, "session": job.session_id, **({"status": job.status} if final else {}),
                    **{k: res[k] for k in ("verified", "problems", "attempt", "calls", "turns") if k in res},
                    **({"prefill_tokens": usage["prefill"]} if usage else {})},
    }


def echoed(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as the response echoes it: a function with its description, parameters and
    `strict` (true where left out: its calls are checked against its schema, jsonschema)."""
    if tool.get("type") != "function":
        return tool
    return {"description": None, "parameters": None, **tool, "strict": tool.get("strict", True)}


def input_items(job: JobRecord) -> list[dict[str, Any]]:
    """The response's input items, as stored, each named after the response and its place."""
    out = []
    for i, x in enumerate(job.spec.get("request", {}).get("items", [])):
        item = {**x, "id": x.get("id") or f"in_{job.id}_{i}"}
        if x["type"] == "message":
            item.setdefault("status", "completed")
        out.append(item)
    return out


def _ts(t: datetime | None) -> int:
    return int(t.timestamp()) if t is not None else 0


def page(items: list[dict[str, Any]], limit: int, order: str, after: str | None) -> dict[str, Any]:
    """OpenAI's list: `data` in `order`, after the item `after`, at most `limit`."""
    items = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [x["id"] for x in items]
        if after not in ids:
            raise BadInput(f"no item {after!r} in this list")
        items = items[ids.index(after) + 1:]
    data = items[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(items) > limit}
