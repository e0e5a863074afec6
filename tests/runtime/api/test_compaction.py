"""runtime/api/openai/compaction.py: what a compaction keeps of a history (its latest messages, in
order, within COMPACT_CHARS; calls and outputs dropped), sealed so that only this deployment
opens it for the same tenant, and read back where it stands in an input."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.api.openai import compaction
from runtime.errors import BadInput

KEY = "a-deployment-secret-key-for-tests"


def msg(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def test_the_latest_messages_are_kept_in_order_calls_and_outputs_dropped() -> None:
    history = [msg("user", "What was churn in APAC in 2026-Q3?"),
               {"type": "function_call", "call_id": "c1", "name": "get_metric", "arguments": "{}"},
               {"type": "function_call_output", "call_id": "c1", "output": "2.7"},
               msg("assistant", "Churn in APAC in 2026-Q3 was 2.7."), msg("user", "And in 2026-Q2?")]
    assert compaction.kept(history) == [{"role": "user", "text": "What was churn in APAC in 2026-Q3?"},
                                        {"role": "assistant", "text": "Churn in APAC in 2026-Q3 was 2.7."},
                                        {"role": "user", "text": "And in 2026-Q2?"}]


def test_the_oldest_go_first_past_the_budget_and_a_long_last_message_keeps_its_end() -> None:
    n = compaction.COMPACT_CHARS
    history = [msg("user", "a" * (n // 2)), msg("assistant", "b" * (n // 2)), msg("user", "c" * 10)]
    assert [m["text"][0] for m in compaction.kept(history)] == ["b", "c"]
    [last] = compaction.kept([msg("user", "x" * n + "the end")])
    assert len(last["text"]) == n and last["text"].endswith("the end")


def test_a_compaction_opens_for_its_tenant_only_and_is_read_where_it_stands() -> None:
    kept = [{"role": "user", "text": "Revenue rose in EMEA."}, {"role": "assistant", "text": "By 4.2%."}]
    item = compaction.item(kept, "acme", KEY)
    assert item["type"] == "compaction" and item["id"].startswith("cmp_") and "EMEA" not in item["encrypted_content"]
    read = compaction.expanded([item, msg("user", "Why?")], "acme", KEY)
    assert read == [msg("user", "Revenue rose in EMEA."), msg("assistant", "By 4.2%."), msg("user", "Why?")]
    # what comes before the latest compaction item is in it: not read again
    again = compaction.expanded([msg("user", "Revenue rose in EMEA."), item, msg("user", "Why?")], "acme", KEY)
    assert again == read
    sealed = item["encrypted_content"]
    for tenant, key, text in [("globex", KEY, sealed), ("acme", "another-deployment-key", sealed),
                              ("acme", KEY, sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")),
                              ("acme", KEY, "not-sealed")]:
        with pytest.raises(BadInput, match="not one setflow made for this tenant"):
            compaction.unseal(text, tenant, key)
    with pytest.raises(BadInput, match="SETFLOW_SECRET_KEY"):
        compaction.item(kept, "acme", None)
