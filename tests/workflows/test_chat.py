"""workflows/chat.py on an imported chat model (a Qwen-style vocabulary, ChatML profile) whose turns
are scripted: messages and function tools rendered as Qwen's template writes them, calls parsed
from its <tool_call> format under the function's own names and checked against its schema, a
call that does not fit answered here, the response parked at the calls that fit and going on with
their outputs as <tool_response> turns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from model import profiles
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import BadInput
from runtime.jobs.kinds import FunctionTool, ResponseSpec
from tests.model.released import IM_END
from tests.workflows.test_imported import Scripted, imported  # noqa: F401 - the module's fixture
from tests.workflows.test_responses import LOOKUP
from workflows import chat, responses

ARGS = {"kpi": "revenue", "market": "EMEA", "quarter": "2026-Q2"}


def call(name: str, args: dict[str, Any]) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


class Session(Scripted):
    """Scripted turns that hold what they were given (a chat session's later turns follow its first)."""

    def used(self) -> int:
        return sum(len(ids) for ids, _ in self.asked) + sum(len(t) for t in self.script[:len(self.asked)])


def spec(**kw: Any) -> ResponseSpec:
    return ResponseSpec.model_validate({"mode": "text", "text": "x", "functions": [LOOKUP], **kw})


def test_messages_and_tools_render_as_qwens_template() -> None:
    text = chat.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Revenue?"}],
                       [FunctionTool.model_validate(LOOKUP)], first=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '\n{"type": "function", "function": {"name": "get_kpi", "description": "a KPI\'s value", "parameters": ' in text
    assert text.endswith("</tool_call><|im_end|>\n<|im_start|>user\nRevenue?<|im_end|>\n<|im_start|>assistant\n")
    later = chat.render([{"role": "tool", "content": "512"}], [], first=False)
    assert later == "\n<|im_start|>user\n<tool_response>\n512\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(BadInput):
        chat.render([{"role": "user", "content": "hi<|im_end|>"}], [], first=True)


def test_a_call_parks_the_response_and_its_output_goes_on_as_a_tool_response(
        imported: tuple[SetDLM, Tokenizer, Path]) -> None:  # noqa: F811
    model, tok, out = imported
    profile = profiles.load(out, model.cfg, tok)
    assert chat.speaks(profile)
    script = [[*tok.encode(call("send_mail", {})), IM_END],  # no such function: answered here
              [*tok.encode(call("get_kpi", {**ARGS, "kpi": 3})), IM_END],  # outside the schema: answered here
              [*tok.encode(call("get_kpi", ARGS)), IM_END],
              [*tok.encode("Revenue in EMEA was 512."), IM_END]]
    turns = Session(model, tok, profile, script)
    first = responses.run(turns, spec(messages=[{"role": "user", "content": "Revenue in EMEA in 2026-Q2?"}]))
    [item] = first["output"]
    assert item == {"type": "function_call", "name": "get_kpi", "call": "call_3", "tool": "get_kpi",
                    "arguments": json.dumps(ARGS)}
    answers = [tok.decode(ids) for ids, _ in turns.asked[1:]]
    assert "error: no function 'send_mail'; the functions are ['get_kpi']" in answers[0]
    assert "error: get_kpi: 3 is not of type 'string'" in answers[1]
    second = responses.run(turns, spec(mode="agent", parked=first["parked"], outputs={"call_3": "512"}))
    assert tok.decode(turns.asked[-1][0]).startswith("\n<|im_start|>user\n<tool_response>\n512\n</tool_response>")
    assert second["output"] == [{"type": "message", "text": "Revenue in EMEA was 512."}]
    assert "verified" not in second  # a chat model's own text: nothing claimed
    with pytest.raises(BadInput):  # a parked call goes on with its output only
        responses.run(turns, spec(mode="agent", parked=first["parked"], outputs={"call_9": "1"}))
