"""runtime/sessions/once.py, and LocalTurns.once over it: a result is recorded on its first run
and replayed after, as JSON; what rows written before `once` hold replays as it is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from model import shipped
from runtime.sessions.local import LocalTurns
from runtime.sessions.once import once


def test_a_result_is_recorded_once_and_replayed_as_json() -> None:
    records: dict[str, str] = {}
    runs: list[int] = []

    def fn() -> Any:
        runs.append(1)
        return {"n": 1.5, "pair": (1, "a")}

    first = once("call_1", fn, records, records.__setitem__)
    assert first == once("call_1", fn, records, records.__setitem__) == {"n": 1.5, "pair": [1, "a"]}
    assert runs == [1] and list(records) == ["server:call_1"]  # beside a client's "call_1"
    with pytest.raises(TypeError):  # not JSON: refused, nothing recorded
        once("bad", lambda: {1, 2}, records, records.__setitem__)
    with pytest.raises(ValueError):  # NaN is no JSON either
        once("bad", lambda: float("nan"), records, records.__setitem__)
    assert list(records) == ["server:call_1"]


def test_local_turns_replay_the_records_a_jobs_row_holds() -> None:
    """A job's tool_outputs as the agent wrote them before once (json.dumps by hand)."""
    model, tok = shipped.load()
    row = {"call_1": "1240", "server:names": json.dumps(["revenue", "EMEA"]),
           "server:call_2": json.dumps({"tool": "metric", "result": "1105", "ok": True})}
    turns = LocalTurns(model, tok, tool_outputs=row)
    assert turns.once("names", lambda: ["changed"]) == ["revenue", "EMEA"]
    assert turns.once("call_2", lambda: {}) == {"tool": "metric", "result": "1105", "ok": True}
    assert turns.tool_output("call_1") == "1240" and turns.once("call_1", lambda: 7) == 7
    assert turns.tool_outputs["server:call_1"] == "7"
