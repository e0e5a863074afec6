"""Responses on an imported chat model (a profile that stops at ChatML's `<|im_end|>`: Qwen3's and
others'): its messages and function tools rendered as Qwen's chat template renders them (the
tools in the system message, one JSON per line between <tools></tools>), its calls parsed from
its tool-call format (<tool_call>{"name", "arguments"}</tool_call>), the client's outputs given
back as <tool_response> in a user turn.

    decode the assistant's turn (up to <|im_end|>)
    -> no call: its text is the answer (a message item)
    -> calls: each must parse, name a declared function and fit its schema; one that does not
       is answered here with the error (a <tool_response>), and the model goes on (up to
       max_calls); calls that fit end the response as function_call items, the session parked
       at them, and the next response carries their outputs

A chat model's answer is its own text: facts enter it written out, and nothing reads it back, so
no `verified` is claimed for it (setflow's own models' answers are checked: workflows/agent.py)."""

from __future__ import annotations

import json
import re
from typing import Any

from model.profiles import Profile
from runtime.errors import BadInput, NoAnswer
from runtime.jobs.kinds import FunctionTool, ResponseSpec
from workflows.turn import Turns, decode_params, ended, text_of, with_stops

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CONTROL = (IM_START, IM_END, "<|endoftext|>")  # what no message may spell: it would end or open a turn
TOOLS = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
         "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tools}\n</tools>\n\n"
         "For each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
         "<args-json-object>}}\n</tool_call>")
CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def speaks(profile: Profile) -> bool:
    """The model's profile is a chat template's (it stops at <|im_end|>)."""
    return IM_END in profile.stop


def render(messages: list[dict[str, str]], functions: list[FunctionTool], first: bool) -> str:
    """The input of one assistant turn: the messages as the template writes them, then the
    assistant's header.  first: the session holds nothing yet (the system message, with the
    tools, goes first; a later turn follows the previous one's <|im_end|>)."""
    for m in messages:
        bad = next((c for c in CONTROL if c in m["content"]), None)
        if bad is not None:
            raise BadInput(f"a message spells {bad}, the chat template's control token")
    system = [m["content"] for m in messages if m["role"] in ("system", "developer")]
    out = ""
    if first and (system or functions):
        tools = "".join("\n" + json.dumps({"type": "function", "function": f.model_dump(
            include={"name", "description", "parameters"}, exclude_none=True)}, ensure_ascii=False) for f in functions)
        content = "\n\n".join([*system, *([TOOLS.format(tools=tools)] if functions else [])])
        out += f"{IM_START}system\n{content}{IM_END}\n"
    for m in messages:
        if m["role"] == "tool":
            out += f"{IM_START}user\n<tool_response>\n{m['content']}\n</tool_response>{IM_END}\n"
        elif m["role"] in ("user", "assistant"):
            out += f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n"
    return ("" if first else "\n") + out + f"{IM_START}assistant\n"


def calls_of(text: str, functions: dict[str, FunctionTool]) -> tuple[list[dict[str, Any]], list[str]]:
    """The calls a turn wrote ({"name", "arguments"}: JSON text) and what is wrong with the others."""
    ok, problems = [], []
    for raw in CALL.findall(text):
        try:
            call = json.loads(raw)
            name, args = call["name"], call.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args)
        except (ValueError, KeyError, TypeError) as e:
            problems.append(f"error: the call is no JSON object with a name and arguments ({e})")
            continue
        f = functions.get(name) if isinstance(name, str) else None
        why = (f"no function {name!r}; the functions are {sorted(functions)}" if f is None
               else f.problem(args) if isinstance(args, dict) else "the arguments are no JSON object")
        if why is not None:
            problems.append(f"error: {why}")
        else:
            ok.append({"name": name, "arguments": json.dumps(args, ensure_ascii=False)})
    return ok, problems


def run(turns: Turns, spec: ResponseSpec) -> dict[str, Any]:
    """The response: the new messages (or the parked calls' outputs) rendered and decoded, calls
    that do not fit answered here, until an answer or calls for the client."""
    tok = turns.tokenizer
    functions = {f.name: f for f in spec.functions}
    params = with_stops(turns, decode_params(spec.params))
    parked = spec.parked or {}
    made = int(parked.get("made", 0))  # calls made so far in this exchange (max_calls bounds them)
    messages = list(spec.messages)
    if parked:
        missing = [c["id"] for c in parked["pending"] if c["id"] not in spec.outputs]
        if missing:
            raise BadInput(f"the calls {missing} wait for their outputs")
        messages = [{"role": "tool", "content": spec.outputs[c["id"]]} for c in parked["pending"]] + \
            [m for m in messages if m["role"] != "system"]
    first = turns.used() == 0
    session = ""
    while True:
        text_in = render(messages, list(functions.values()), first)
        r = turns.turn(tok.encode(text_in), params, text=text_in)
        session, first = r.session, False
        text = text_of(turns, r.tokens)
        calls, problems = calls_of(text, functions)
        if not calls and not problems:  # the answer
            cut = not ended(turns, r.tokens)
            return {"session": session, "status": "incomplete" if cut else "completed",
                    "incomplete": "max_output_tokens" if cut else None,
                    "output": [{"type": "message", "text": text.strip()}]}
        made += len(calls) + len(problems)
        if made > spec.max_calls:
            raise NoAnswer(f"the call limit ({spec.max_calls}) was reached before an answer",
                           ["no answer: the call limit was reached"])
        if problems:  # answered here: the model mends its call
            messages = [{"role": "tool", "content": p} for p in problems]
            continue
        pending = [{"id": f"call_{made - len(calls) + i + 1}", **c} for i, c in enumerate(calls)]
        return {"session": session, "status": "completed", "incomplete": None,
                "output": [{"type": "function_call", "name": c["name"], "call": c["id"], "tool": c["name"],
                            "arguments": c["arguments"]} for c in pending],
                "parked": {"chat": True, "pending": pending, "made": made}}
