"""domain/document.py: the first sentence found by the narrative's forms (names and numbers
hold periods), what each detail level shows, tables that survive any name."""

from __future__ import annotations

import html
import random
import re

import pytest
from markdown_it import MarkdownIt

from domain import charts, document, drivers
from domain.draws import wild_payload
from domain.narrative import narrative
from domain.payload import STYLES, Breakdown, Metric, Payload

PAYLOAD = Payload("St. Mary's Co.", "2026-Q3", "formal",
                  [Metric("revenue", "1240.5", "1105.25", "1300"), Metric("churn", "2.4", "2.6")],
                  Breakdown("region", "revenue", [("N. America | West", "512", "468"), ("APAC", "301", "318")]))


def written(p: Payload, seed: int = 0) -> str:
    """A narrative as a job's result holds it: the facts written out."""
    return p.render().slots.lexicalise(narrative(random.Random(seed), p))


@pytest.mark.parametrize("style", STYLES)
def test_the_first_sentence_is_the_first_metrics_clause(style: str) -> None:
    p = Payload(PAYLOAD.tenant, PAYLOAD.period, style, PAYLOAD.metrics, PAYLOAD.breakdown)
    for seed in range(8):
        text = written(p, seed)
        first = document.first_sentence(p, text)
        assert first.startswith("Revenue ") and first.endswith(".") and "1240.5" in first and "1105.25" in first
        assert "Churn" not in first and "Northwind" not in first and "St. Mary" not in first  # not the lead
        assert text.endswith(text[text.index(first):])


def test_the_first_sentence_of_any_payload() -> None:
    rng = random.Random(3)
    for _ in range(200):
        p = wild_payload(rng)
        text = written(p, rng.randrange(99))
        first = document.first_sentence(p, text)
        assert first and first in text and first.startswith(p.metrics[0].display)


def test_a_text_the_forms_do_not_write_is_kept_whole() -> None:
    assert document.first_sentence(PAYLOAD, "Something else. Entirely.") == "Something else. Entirely."


def doc(detail: str, figures: str | None = None) -> document.Document:
    part = document.Part("Revenue", written(PAYLOAD), PAYLOAD, charts.chart(PAYLOAD, "Revenue"), drivers.drivers(PAYLOAD))
    return document.Document("Q3 review", "Report · St. Mary's Co., 2026-Q3", detail, [part], figures)


def fake_svg(spec: dict[str, object]) -> str:
    return f"<svg><text>{len(spec['vconcat'])} charts</text></svg>"  # type: ignore[arg-type]


def test_what_each_level_shows() -> None:
    text = written(PAYLOAD)
    first = document.first_sentence(PAYLOAD, text)
    summary, standard, full = (document.markdown(doc(d)) for d in document.DETAILS)
    assert first in summary and text not in summary and "| driver |" not in summary
    assert rendered_text(text) in rendered_text(standard) and "| driver |" in standard
    assert "share of change" not in standard
    assert rendered_text(text) in rendered_text(full)
    assert "| region | value | prev | change | share of change | share of value |" in full
    assert "| N. America \\| West | 512 | 468 | +44 |" in full  # a name's pipe escaped in a table
    with_figures = document.markdown(doc("summary", figures="Revenue: 1240.5 k USD (up)."))
    assert "## Key figures" in with_figures and first not in with_figures  # a report's summary: its key figures
    pages = {d: document.html_page(doc(d), fake_svg) for d in document.DETAILS}
    assert all("<svg><text>2 charts</text></svg>" in page for page in pages.values())  # the chart at every level
    assert "<table>" not in pages["summary"] and pages["full"].count("<table>") == 3
    assert "St. Mary&#x27;s Co." in pages["full"] and "N. America | West" in pages["full"]


def rendered_text(md: str) -> str:
    """Markdown as a CommonMark renderer shows it, as text (tags out, entities read)."""
    return html.unescape(re.sub(r"<[^>]+>", "", MarkdownIt("commonmark").enable("table").render(md)))


TRICKY = ["net_revenue_usd", "*Acme* **Inc**", "<b>Globex</b>", "[Initech](http://x)", "Müller & Söhne",
          "`ops`", "~~old~~", "#1 Team", "Team #", "Rang # 2", "- EMEA", "1. Nordics", "a\\b", "Q3 | Q4", "!img"]


@pytest.mark.parametrize("name", TRICKY)
def test_markdown_shows_any_name_as_written_no_markup_from_it(name: str) -> None:
    p = Payload(name, "2026-Q3", "formal", [Metric("revenue", "1240.5", "1105.25")],
                Breakdown("region", "revenue", [(name, "512", "468"), ("APAC", "301", "318")]))
    text = written(p)
    part = document.Part(name, text, p, charts.chart(p, name), drivers.drivers(p))
    md = document.markdown(document.Document(name, f"Report · {name}", "full", [part], f"{name}: 1240.5"))
    page = MarkdownIt("commonmark").enable("table").render(md)
    shown = rendered_text(md)
    assert page.count("<h1>") == 1 and page.count("<h2>") == 2 and "<li>" not in page, page  # no heading or list of its own
    assert page.count("<em>") == 1  # the subtitle's own
    for tag in ("<strong>", "<a ", "<code>", "<b>", "<s>", "<del>", "<img"):
        assert tag not in page, (tag, page)
    assert text in shown and f"Report · {name}" in shown and f"{name}: 1240.5" in shown
    assert f"<h1>{html.escape(name, quote=False)}</h1>" in page and f"<h2>{html.escape(name, quote=False)}</h2>" in page
    assert f"<td>{html.escape(name, quote=False)}</td>\n<td>512</td>" in page  # the breakdown's cell as written


def test_the_largest_contributor_is_of_the_rows_shown_where_they_do_not_cover_the_change() -> None:
    def table(rows: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
        p = Payload("Acme", "2026-Q3", "formal", [Metric("revenue", "1240", "1105")], Breakdown("region", "revenue", rows))
        return document.main_drivers(drivers.drivers(p))

    rows = [("EMEA", "512", "468"), ("APAC", "301", "318"), ("AMER", "427", "319")]
    assert ("Revenue: largest contributor to the change", "AMER (80.00% of +135)") in table(rows)
    assert ("Revenue: largest contributor of the rows shown", "EMEA (32.59% of +135)") in table(rows[:2])
