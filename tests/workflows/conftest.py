"""The shipped model, loaded once for the workflow tests, a new in-process session, and a report
long enough to nearly fill the shipped model's context."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.demo import REPORT
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
    sections take 1020 positions at most, 6 take 1861 of the shipped model's 2048."""
    spec = ReportSpec.model_validate(REPORT)
    data = {m.key: m for m in spec.data.to_payload().metrics}
    outline = []
    for i in range(n_sections):
        part = spec.outline[i % len(spec.outline)]
        titles = [t for t in TITLES[data[part.metrics[0]].key] if t != part.title]
        outline.append(part if i < len(spec.outline) else part.model_copy(update={"title": titles[0]}))
    return spec.model_copy(update={"outline": outline, **update})
