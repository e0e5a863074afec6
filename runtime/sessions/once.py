"""Record or replay, once: a side effect's result is recorded as JSON under its key on its first
run and read back on every run after, as a Temporal activity's is (Turns.once, workflows/turn.py).
Where the records live (a job's row in SQL, a dict in this process) is the caller's; this knows
the key and the text only.  JSON both ways, never pickle: a record outlives the code that wrote it."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

#: a record's key is the workflow's with this prefix: records share a job's `tool_outputs` with the
#: outputs its client sends under their call ids ("call_1"), and rows written before once existed
#: hold "server:names" and "server:call_<n>" (migration 0005_tools), which replay as they are
RECORDED = "server:"


def once(key: str, fn: Callable[[], Any], records: Mapping[str, str], record: Callable[[str, str], None]) -> Any:
    """The result recorded under `key` in `records`; where there is none, fn() is run, its result
    recorded by `record(full key, JSON text)`, and returned as a replay would read it back (a
    tuple comes back a list): the first run and every rerun see the same value.  fn's result must
    be JSON (TypeError or ValueError otherwise, with nothing recorded)."""
    text = records.get(RECORDED + key)
    if text is None:
        text = json.dumps(fn(), allow_nan=False)
        record(RECORDED + key, text)
    return json.loads(text)
