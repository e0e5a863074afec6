"""domain/drivers.py on constructed data: the drivers name the right rows (the largest
contributor, a dominant row, a row moving against the total), shares are exact and signed,
and a ratio with no meaning is None, never a division error."""

from __future__ import annotations

import random
from decimal import Decimal

from domain import drivers
from domain.draws import wild_payload
from domain.payload import Breakdown, Metric, Payload


def payload(value: str, prev: str, rows: list[tuple[str, str, str]], target: str | None = None) -> Payload:
    return Payload("Acme", "2026-Q3", "formal", [Metric("revenue", value, prev, target)],
                   Breakdown("region", "revenue", rows))


def test_the_largest_contributor_a_dominant_row_and_a_row_against_the_total() -> None:
    # revenue 1105 -> 1240 (+135): AMER +108 (80%), EMEA +44, APAC -17 against it
    d = drivers.drivers(payload("1240", "1105", [("EMEA", "512", "468"), ("APAC", "301", "318"), ("AMER", "427", "319")],
                                target="1300"))
    b = d["breakdown"]
    assert b["largest"] == "AMER" and b["dominant_delta"] == "AMER" and b["against"] == ["APAC"]
    assert b["dominant_value"] is None  # EMEA holds 41%: nobody more than half of the value
    rows = {r["name"]: r for r in b["rows"]}
    assert [rows[n]["share_of_delta"] for n in ("EMEA", "APAC", "AMER")] == ["0.3259", "-0.1259", "0.8000"]
    assert rows["APAC"]["against"] and not rows["AMER"]["against"]
    assert rows["AMER"]["delta"] == "108" and rows["APAC"]["delta"] == "-17"
    assert d["metrics"][0] == {"metric": "Revenue", "unit": "k USD", "value": "1240", "prev": "1105", "delta": "135",
                               "target": "1300", "pace": "0.6923"}  # 135 of the 195 to go


def test_a_row_holding_most_of_the_value_is_dominant_whatever_it_moved() -> None:
    b = drivers.drivers(payload("1000", "990", [("Enterprise", "700", "705"), ("SMB", "300", "285")]))["breakdown"]
    assert b["dominant_value"] == "Enterprise"  # 70% of the value
    assert b["largest"] == "SMB" and b["dominant_delta"] == "SMB"  # +15 of +10: 150%
    assert b["against"] == ["Enterprise"]  # -5 while the total rose
    assert [r["share_of_delta"] for r in b["rows"]] == ["-0.5000", "1.5000"]


def test_a_falling_total_the_largest_contributor_is_the_largest_fall() -> None:
    b = drivers.drivers(payload("80", "100", [("A", "50", "55"), ("B", "30", "45")]))["breakdown"]
    assert b["largest"] == "B" and b["dominant_delta"] == "B" and b["against"] == []
    assert [r["share_of_delta"] for r in b["rows"]] == ["0.2500", "0.7500"]  # a fall's shares are positive too


def test_no_change_has_no_shares_and_no_contributor() -> None:
    b = drivers.drivers(payload("100", "100", [("A", "60", "50"), ("B", "40", "50")]))["breakdown"]
    assert all(r["share_of_delta"] is None and not r["against"] for r in b["rows"])
    assert b["largest"] is None and b["dominant_delta"] is None and b["against"] == []
    assert b["dominant_value"] == "A"


def test_negative_values_have_no_share_of_value() -> None:
    b = drivers.drivers(payload("10", "-20", [("A", "40", "10"), ("B", "-30", "-30")]))["breakdown"]
    assert [r["share_of_value"] for r in b["rows"]] == [None, None] and b["dominant_value"] is None
    assert b["largest"] == "A" and [r["share_of_delta"] for r in b["rows"]] == ["1.0000", "0.0000"]


def test_pace_to_target() -> None:
    assert drivers.pace("1240", "1105", "1300") == Decimal("0.6923")
    assert drivers.pace("1300", "1105", "1300") == Decimal("1.0000")  # reached
    assert drivers.pace("2.4", "2.6", "2.5") == Decimal("2.0000")  # passed (lower is better here: its own sign)
    assert drivers.pace("90", "100", "120") == Decimal("-0.5000")  # moved away
    assert drivers.pace("90", "100", None) is None and drivers.pace("90", "100", "100") is None  # no way to go


def test_exact_decimal_arithmetic() -> None:
    # binary floats would make 0.3 - 0.1 = 0.19999999999999998
    d = drivers.drivers(payload("0.3", "0.1", [("A", "0.2", "0.1"), ("B", "0.1", "0")]))
    assert d["metrics"][0]["delta"] == "0.2" and [r["delta"] for r in d["breakdown"]["rows"]] == ["0.1", "0.1"]
    assert [r["share_of_delta"] for r in d["breakdown"]["rows"]] == ["0.5000", "0.5000"]
    assert d["breakdown"]["dominant_delta"] is None  # exactly half is not more than half


def test_without_a_breakdown() -> None:
    p = Payload("Acme", "2026-Q3", "brief", [Metric("churn", "2.4", "2.6")])
    assert drivers.drivers(p) == {"metrics": [{"metric": "Churn", "unit": "%", "value": "2.4", "prev": "2.6", "delta": "-0.2",
                                               "target": None, "pace": None}], "breakdown": None}


def test_any_payload_of_the_grammar() -> None:
    """Whatever the API accepts: no error; shares with the total's sign add up to the rows'
    own delta over the metric's."""
    rng = random.Random(30)
    for _ in range(300):
        p = wild_payload(rng)
        d = drivers.drivers(p)
        assert len(d["metrics"]) == len(p.metrics)
        b = d["breakdown"]
        if b is None:
            continue
        assert [r["name"] for r in b["rows"]] == [r[0] for r in p.breakdown.rows]  # type: ignore[union-attr]
        for r in b["rows"]:
            assert Decimal(r["delta"]) == Decimal(r["value"]) - Decimal(r["prev"])
            if r["against"]:
                assert r["name"] in b["against"] and Decimal(r["share_of_delta"]) <= 0  # 0: a tiny one, rounded
            assert not r["share_of_delta"] or not r["share_of_delta"].startswith("-0.0000")
        if b["largest"] is not None:
            assert b["largest"] not in b["against"]


def test_a_narratives_share_of_the_change_is_rounded_once_from_the_deltas() -> None:
    """87645 of a change of 100000 is 87.645%: one decimal half up says 87.6% (rounded first to
    the ratio's 4 decimals, 0.8765, it said 87.7%)."""
    p = payload("300000", "200000", [("A", "187645", "100000"), ("B", "112355", "100000")])
    r = drivers.rendered(p, said=True)
    assert r.drivers is not None and r.slots.lexicalise(r.drivers.share) == "87.6%"
    assert drivers.share_percent("108", "135") == "80.0%" and drivers.share_percent("1", "3") == "33.3%"


def test_the_rows_cover_the_change_only_where_their_deltas_add_up_to_the_metrics() -> None:
    whole = drivers.drivers(payload("1240", "1105", [("EMEA", "512", "468"), ("APAC", "301", "318"), ("AMER", "427", "319")]))
    part = drivers.drivers(payload("1240", "1105", [("EMEA", "512", "468"), ("APAC", "301", "318")]))
    assert whole["breakdown"]["covers"] and not part["breakdown"]["covers"]
    assert part["breakdown"]["largest"] == "EMEA"  # the largest of the rows shown, 32.6% of the whole change
