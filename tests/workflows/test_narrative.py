"""workflows/narrative.py over a session in this process (the shipped model): the narrative of a
payload with every fact read back, for AR and set decoding."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from domain import charts, drivers
from domain import narrative as corpus
from domain.facts import slots_in
from domain.payload import Breakdown, Metric, Payload
from runtime.jobs.params import ParamsSpec
from runtime.jobs.payload import PayloadSpec
from runtime.jobs.specs import NarrativeSpec
from runtime.sessions.local import LocalTurns
from workflows import narrative

PAYLOAD = Payload(
    "Globex", "2026-Q3", "brief",
    [Metric("revenue", "1240", "1105", "1300"), Metric("churn", "2.4", "2.6")],
    Breakdown("region", "revenue", [("EMEA", "400", "380"), ("APAC", "300", "310")]))
PARAMS = {"ar": ParamsSpec(policy="ar", window=1, tau=None, max_new_tokens=200),
          "set": ParamsSpec(policy="set", window=4, tau=0.9, max_new_tokens=200),
          "prefix": ParamsSpec(policy="prefix", window=8, tau=0.99, max_new_tokens=200)}


@pytest.mark.parametrize("policy", ["ar", "set", "prefix"])
def test_a_narrative_reads_back_every_fact_of_its_payload(session: Callable[[], LocalTurns], policy: str) -> None:
    spec = NarrativeSpec(payload=PayloadSpec.of(PAYLOAD), params=PARAMS[policy])
    r = narrative.run(session(), spec)
    assert r["facts_total"] > 0 and r["facts_ok"] == r["facts_total"] and r["problems"] == [], r["text"]
    # the text comes back written out (no slot left); read back in slot form, it is fully correct
    slots = PAYLOAD.render().slots
    assert not slots_in(r["text"]) and "1240 k USD" in r["text"] and r["text"].endswith(".")
    assert corpus.check(PAYLOAD, slots.delexicalise(r["text"])).fully_correct
    assert slots.lexicalise(slots.delexicalise(r["text"])) == r["text"]
    assert r["path"] == "new" and r["turn"] == 0 and "worker" not in r
    assert r["verified"] and r["attempt"] == "first"  # read back right on its first decode: no retry
    p = spec.payload.to_payload()  # the chart and drivers: of the payload, never of the model's text
    assert r["chart"] == charts.chart(p, f"{p.tenant}, {p.period}") and r["drivers"] == drivers.drivers(p)
    assert (r["detail"], r["audience"]) == ("standard", None)
    if policy == "ar":  # one token per step, plus the prompt's prefill and the last token's commit
        assert r["nfe"] == r["tokens"] + 2
    else:  # parallel decoding: fewer forwards than tokens
        assert r["nfe"] < r["tokens"]


def test_the_same_spec_writes_the_same_text_on_each_new_session(session: Callable[[], LocalTurns]) -> None:
    spec = NarrativeSpec(payload=PayloadSpec.of(PAYLOAD))  # the kind's default setting
    a, b = narrative.run(session(), spec), narrative.run(session(), spec)
    assert a["text"] == b["text"] and a["nfe"] == b["nfe"] and a["facts_ok"] == a["facts_total"]
