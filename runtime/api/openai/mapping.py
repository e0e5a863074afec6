"""The request -> a `response` job's spec (runtime/jobs/kinds.ResponseSpec): the mode (text or
agent), the decoding parameters, the tool the first decode must call, and the outputs of the
calls a previous response waits for."""

from __future__ import annotations

from typing import Any

from runtime.api.openai.request import BuiltinTool, CreateResponse, NamedChoice
from runtime.errors import BadInput
from runtime.jobs.kinds import FunctionTool, ResponseSpec
from runtime.tables import JobRecord
from workflows import structured


def plan(req: CreateResponse, items: list[dict[str, Any]], parked: JobRecord | None) -> dict[str, Any]:
    """The job spec (ResponseSpec) for the request, its input `items` (the request's, after the
    conversation's pending ones), going on from `parked` (the previous response, when it ended at
    function calls).  BadInput where the input does not fit what the previous response left:
    calls waiting for their outputs get one each, and only waiting calls do."""
    outputs = [x for x in items if x["type"] == "function_call_output"]
    messages = [x for x in items if x["type"] == "message"]
    tools = [t for t in req.tools if isinstance(t, FunctionTool)] if req.tool_choice != "none" else []
    builtin = [t for t in req.tools if isinstance(t, BuiltinTool)] if req.tool_choice != "none" else []
    ext = req.setflow
    params = {k: v for k, v in {"policy": ext.policy, "window": ext.window, "tau": ext.tau, "seed": ext.seed,
                                "ignore_eos": ext.ignore_eos, "max_new_tokens": req.max_output_tokens,
                                "temperature": req.temperature}.items() if v is not None}
    spec: dict[str, Any] = {"params": params, "allow_unverified": ext.allow_unverified,
                            "functions": [t.model_dump() for t in tools]}  # the input: the request's items (stored once)
    if (force := forced(req, tools, builtin)) is not None:
        spec["force"] = force
    if ext.max_calls is not None or req.max_tool_calls is not None:  # OpenAI's bound, within setflow's own
        spec["max_calls"] = min(x for x in (ext.max_calls, req.max_tool_calls, 8) if x is not None)
    waiting = waiting_calls(parked)
    if waiting:
        given = [o["call_id"] for o in outputs]
        if sorted(given) != sorted(waiting):
            raise BadInput(f"the previous response waits for the outputs of {list(waiting)}: give one "
                           f"function_call_output for each; got {given}")
        assert parked is not None and parked.result is not None
        by_call = {waiting[o["call_id"]]: o["output"].strip() for o in outputs}  # "512\n" is 512 (as the answer says it)
        if len(by_call) == 1 and len(out := next(iter(by_call.values()))) > MAX_OUTPUT:
            raise BadInput(f"a function_call_output the model reads is at most {MAX_OUTPUT} characters (it reads it as "
                           f"one fact, and an answer quotes it whole); got {len(out)}: send the part the question asks for")
        spec.update(mode="agent", parked=parked.result["parked"], outputs=by_call,
                    builtin=parked.spec.get("builtin", []), dataset=parked.spec.get("dataset"))
        if len(by_call) == 1:
            spec["output"] = next(iter(by_call.values()))
        return structured.planned(spec, req.text)
    if outputs:
        raise BadInput(f"no call waits for an output here; got {[o['call_id'] for o in outputs]}")
    users = [m for m in messages if m["role"] == "user"]
    if not users:
        raise BadInput("the input holds no user message")
    if builtin or any(t.skill() is not None or t.unfilled() for t in tools):  # one it cannot fill: failed, saying why
        spec.update(mode="agent",  # its question: the last user message, read from `messages` (stored once)
                    builtin=[{"setflow_metric": "metric", "setflow_calc": "calc"}[t.type] for t in builtin],
                    dataset=next((t.dataset for t in builtin if t.type == "setflow_metric"), None))
    else:  # the messages in order, each a line, read from `messages` (ResponseSpec): what a text model continues
        spec.update(mode="text")
    return structured.planned(spec, req.text)


#: the most characters of a function's output the agent reads (ResponseSpec.output's bound)
MAX_OUTPUT: int = next(m.max_length for m in ResponseSpec.model_fields["output"].metadata if hasattr(m, "max_length"))


def forced(req: CreateResponse, tools: list[FunctionTool], builtin: list[BuiltinTool]) -> str | None:
    """The tool the response's first decode must call (ResponseSpec.force): a named function's
    skill (tool_choice {"type": "function", "name"}), or, for `required`, the one skill its tools
    offer ("any" where they offer both); None for auto and none.  BadInput where the shipped
    model cannot make the call asked for: a named function whose parameters fit no skill of its
    (docs/api.md, "Function tools") or whose skill another tool takes, or `required` with no
    tool it can call."""
    choice = req.tool_choice
    if choice in ("auto", "none"):
        return None
    own = {"setflow_metric": "metric", "setflow_calc": "calc"}
    taken = {own[t.type] for t in builtin}
    if isinstance(choice, NamedChoice):
        f = next(t for t in tools if t.name == choice.name)
        skill = f.skill()
        if skill is None:
            raise BadInput(f"tool_choice names {f.name}, which the model cannot call: it calls a lookup by three names "
                           "(parameters: three required strings), a calculator (one required string), or a function "
                           "of 1 to 4 strings, enums, integers, numbers, booleans and arrays of those, one of them "
                           f"required, whose values the question gives, and {f.name}'s parameters are neither; leave tool_choice "
                           "auto, or declare such a function")
        first = next(t for t in tools if t.skill() == skill)
        if skill in taken or first is not f:
            raise BadInput(f"tool_choice names {f.name}, but the model calls "
                           f"{'setflow_' + skill if skill in taken else first.name} for that skill: name that one")
        return skill
    skills = taken | {s for t in tools if (s := t.skill()) is not None}
    if not skills:
        raise BadInput("tool_choice is required, but the model can call none of the tools: it calls a lookup by "
                       "three names (parameters: three required strings), a calculator (one required string), or a "
                       "function of 1 to 4 strings, enums, integers, numbers, booleans and arrays of those, one of "
                       "them required, whose values the question gives")
    return skills.pop() if len(skills) == 1 else "any"


def waiting_calls(parked: JobRecord | None) -> dict[str, str]:
    """The public ids of the calls the previous response waits for (it ended at function calls)
    -> the workflow's ids ("call_<n>"); {} where it waits for none."""
    if parked is None or parked.result is None or not parked.result.get("parked"):
        return {}
    pending = parked.result["parked"]["pending"]
    calls = pending if isinstance(pending, list) else [pending]  # a chat model's several, the agent's one
    return {f"call_{parked.id}_{c['id'].removeprefix('call_')}": c["id"] for c in calls}


def message_text(message: dict[str, Any]) -> str:
    return "".join(p["text"] for p in message["content"])


def spec(req: CreateResponse, items: list[dict[str, Any]], prev: JobRecord | None, conv: str | None) -> dict[str, Any]:
    """The job's spec (BadInput where the request does not fit), going on from `prev`."""
    out = plan(req, items, prev)
    if prev is not None:
        out["previous"] = prev.id
    out["request"] = {**req.model_dump(mode="json", exclude={"input", "setflow", "stream"}, exclude_none=True),
                      "items": items, "conversation": conv, "store": req.store, "background": req.background,
                      **({"step_events": True} if req.setflow.step_events else {})}
    return out
