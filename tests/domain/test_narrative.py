"""Narratives: deterministic, every generated text passes its checker, and the checker catches a
wrong number, a wrong direction, a wrong comparison, a missing or repeated clause."""

import random

import pytest

from domain import narrative as n


def _examples(seed: int, k: int) -> list[tuple[n.Payload, str]]:
    rng = random.Random(seed)
    return [n.example(rng) for _ in range(k)]


def test_generation_is_deterministic_by_seed() -> None:
    a, b = _examples(5, 100), _examples(5, 100)
    assert [(p.to_text(), t) for p, t in a] == [(p.to_text(), t) for p, t in b]
    assert [t for _, t in a] != [t for _, t in _examples(6, 100)]


def test_every_generated_narrative_passes_its_checker() -> None:
    styles, dirs, cmps = set(), set(), set()
    for p, text in _examples(0, 2000):
        c = n.check(p, text)
        assert c.fully_correct, (c.problems, p.to_text(), text)
        assert c.facts_ok == c.facts_total == sum(f.count for f in p.facts())
        styles.add(p.style)
        dirs |= {f.direction for f in p.facts()}
        cmps |= {f.comparison for f in p.facts()}
    assert styles == set(n.STYLES) and dirs == {"up", "down", "flat"} and cmps >= {"above", "below", "on", None}


def test_facts_follow_the_payload() -> None:
    assert n.direction("1240", "1105") == "up" and n.direction("2.4", "2.4") == "flat"
    assert n.direction("980", "1020") == "down" and n.comparison("9.5", "10.0") == "below"
    assert n.comparison("3.0", "3.0") == "on" and n.comparison("4", None) is None


def _payload() -> n.Payload:
    return n.Payload("Globex", "2026-Q2", "brief",
                     [n.Metric("revenue", "1240", "1105", "1300"), n.Metric("churn", "2.4", "2.4")],
                     n.Breakdown("region", "revenue", [("EMEA", "400", "380"), ("APAC", "300", "310")]))


GOOD = ("Revenue rose to 1240 k USD from 1105, below the 1300 target. Churn held flat at 2.4 % from 2.4. "
        "By region, EMEA rose to 400 from 380 and APAC fell to 300 from 310.")


@pytest.mark.parametrize("bad,lost", [
    (GOOD.replace("1240", "1250"), 1),  # a wrong value
    (GOOD.replace("Revenue rose", "Revenue fell"), 1),  # a wrong direction
    (GOOD.replace("below the", "above the"), 1),  # a wrong comparison
    (GOOD.replace("APAC fell", "APAC grew"), 1),  # a wrong breakdown direction
    (GOOD.replace(" and APAC fell to 300 from 310", ""), 3),  # a missing clause: its 3 facts
])
def test_the_checker_catches_wrong_facts(bad: str, lost: int) -> None:
    p = _payload()
    assert n.check(p, GOOD).fully_correct
    c = n.check(p, bad)
    assert not c.fully_correct and c.facts_total - c.facts_ok == lost, c.problems


@pytest.mark.parametrize("bad", [
    GOOD + " Revenue rose to 1240 k USD from 1105.",  # a clause twice
    "In 7 days: " + GOOD,  # a stray number
    GOOD.replace("Churn held flat at 2.4 % from 2.4. ", "") + " Churn held flat at 2.4 % from 2.4.",  # order
    GOOD.replace("from 1105", "from 1105 or 1200"),  # an extra number in a clause
])
def test_the_checker_refuses_repeats_strays_and_reordering(bad: str) -> None:
    assert not n.check(_payload(), bad).fully_correct
