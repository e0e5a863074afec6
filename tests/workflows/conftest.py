"""The shipped model, loaded once for the workflow tests, a new in-process session, the demo's
report with more sections, and a report whose sections write a 12-row breakdown each (long
enough to nearly fill the shipped model's context)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.demo import REPORT
from domain.grammar import MAX_ROWS
from domain.report import TITLES
from model import shipped
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.jobs.specs import ReportSpec
from runtime.sessions.local import LocalTurns


@pytest.fixture(scope="session")
def loaded() -> tuple[SetDLM, Tokenizer]:
    return shipped.load()


@pytest.fixture
def session(loaded: tuple[SetDLM, Tokenizer]) -> Callable[[], LocalTurns]:
    """A new session in this process, on each call."""
    return lambda: LocalTurns(*loaded)


def report_spec(n_sections: int, **update: object) -> ReportSpec:
    """The demo's report with n sections: its outline's metrics in turn, each section under
    another of the titles the corpus gives that metric (domain/report.py TITLES); 3
    sections take 486 positions at most, 6 take 839 of the shipped model's 2048 (each section
    is planned for its own longest body, report.section_tokens)."""
    spec = ReportSpec.model_validate(REPORT)
    data = {m.key: m for m in spec.data.to_payload().metrics}
    outline = []
    for i in range(n_sections):
        part = spec.outline[i % len(spec.outline)]
        titles = [t for t in TITLES[data[part.metrics[0]].key] if t != part.title]
        outline.append(part if i < len(spec.outline) else part.model_copy(update={"title": titles[0]}))
    return spec.model_copy(update={"outline": outline, **update})


def long_report_spec(n_long: int, n_short: int = 0, **update: object) -> ReportSpec:
    """The demo's data with a breakdown of MAX_ROWS regions: n_long sections on revenue (the
    broken-down metric, first) and churn, each writing every row (393 positions at most each),
    then n_short sections on latency alone (83 each); with the key figures (133): 4 long take
    1705 of the shipped model's 2048 positions, 4 long and 2 short 1871, 5 long do not fit."""
    spec = ReportSpec.model_validate(REPORT)
    regions = ("EMEA", "APAC", "AMER", "LATAM", "Nordics", "DACH", "Benelux", "Iberia", "UK", "France", "Italy", "Japan")
    # up and down in turn (the shipped model leaves out the first row's trend word where all 12 rise)
    rows = [(n, str(300 + 7 * i), str(310 - 3 * i) if i % 2 else str(290 + 5 * i)) for i, n in enumerate(regions)]
    assert len(rows) == MAX_ROWS
    assert spec.data.breakdown is not None
    data = spec.data.model_copy(update={"breakdown": spec.data.breakdown.model_copy(update={"rows": rows})})
    long_titles = ("Revenue", "Sales performance", "Top line", "Customer health", "Retention")
    short_titles = ("Platform performance", "Reliability")
    outline = [spec.outline[0].model_copy(update={"title": t, "metrics": ["revenue", "churn"]})
               for t in long_titles[:n_long]]
    outline += [spec.outline[2].model_copy(update={"title": t}) for t in short_titles[:n_short]]
    return spec.model_copy(update={"data": data, "outline": outline, **update})
