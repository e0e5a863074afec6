"""What the runtime computes of a payload's numbers (domain/payload.py): the trend, the standing
against the target, the percent change, exactly (decimal, never float)."""

import pytest

from domain.payload import change, comparison, direction


def test_facts_follow_the_payload() -> None:
    assert direction("1240", "1105") == "up" and direction("2.4", "2.40") == "flat"
    assert direction("980", "1020") == "down" and comparison("9.5", "10.0") == "below"
    assert comparison("3.0", "3") == "on" and comparison("4", None) is None
    assert direction("-120", "-80") == "down" and comparison("-0.5", "-1") == "above"
    assert direction("123456789012345", "123456789012344") == "up"  # 15 digits: no float rounding


@pytest.mark.parametrize("value,prev,said", [
    ("1240", "1105", "12.2%"), ("1105", "1240", "10.9%"), ("5", "0", None), ("-5", "-10", None), ("3", "-2", None),
    ("2.4", "2.40", None), ("10001", "10000", "0.01%"), ("1000001", "1000000", "under 0.01%"), ("0.06", "0.05", "20.0%"),
    ("10001.15", "10000", "0.012%"), ("10009.96", "10000", "0.1%"),  # half up under 0.1% too (a float said 0.011%)
])
def test_the_runtime_computes_the_percent_change(value: str, prev: str, said: str | None) -> None:
    assert change(value, prev) == said
