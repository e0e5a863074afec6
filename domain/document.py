"""A narrative's or a report's export as a document: its parts (text, chart, drivers) chosen by
the detail level, written as Markdown or as one self-contained HTML page.  Plain text in, plain
text out: the charts come in as SVG from the caller (runtime/api/exports.py renders them), so
this knows nothing of Vega-Lite's renderer, of PDF or of jobs.

Detail levels (what a reader gets; the model writes the same text at every level):

    summary   the key figures (a report with them), else each part's first sentence; the charts
    standard  every part's text, its chart and a small table of its main drivers
    full      as standard, then every driver: each metric's change and pace, the breakdown's rows
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from domain.narrative import leads, metric_form, pattern
from domain.payload import Payload

DETAILS = ("summary", "standard", "full")


@dataclass
class Part:
    """One titled part: a narrative (title None: the document's own) or a report section."""

    title: str | None
    text: str  # as the model's text was written out (facts in place)
    payload: Payload  # what it was written from
    chart: dict[str, Any]  # its Vega-Lite spec (domain/charts.py)
    drivers: dict[str, Any]  # domain/drivers.py's


@dataclass
class Document:
    title: str
    subtitle: str  # the tenant and period, and the audience where one is named
    detail: str  # one of DETAILS
    parts: list[Part]
    figures: str | None = None  # a report's key figures (its filled template), if it has them
    notes: list[str] = field(default_factory=list)  # said under the title (an unverified part)


# ---- what a level shows -----------------------------------------------------------------------


def first_sentence(p: Payload, text: str) -> str:
    """The narrative's first sentence of fact: its first metric's clause, the lead before it
    ("In 2026-Q3, Northwind reported the following.") left out.  Found by the narrative's own
    forms (domain/narrative.py), not by splitting at a period: names and numbers hold periods.
    A text the forms do not write (an unverified one) is returned whole."""
    r = p.render()
    lex = r.slots.lexicalise
    lead = [tuple(lex(a) for a in leads(r))]
    clause = [tuple(lex(a) for a in alts) for alts in metric_form(r.metrics[0], r.style, True)]
    whole, opening = pattern(lead + clause).match(text), pattern(lead).match(text)
    return text if whole is None or opening is None else text[opening.end(): whole.end()]


def percent(ratio: str | None) -> str:
    """A driver's ratio ("0.6923") as a percent ("69.23%"): exact, its 4 decimals kept; "—" for none."""
    if ratio is None:
        return "—"
    return f"{(Decimal(ratio) * 100).quantize(Decimal('0.01'), ROUND_HALF_UP)}%"


def signed(x: str) -> str:
    return x if x.startswith("-") or Decimal(x) == 0 else "+" + x


def main_drivers(d: dict[str, Any]) -> list[tuple[str, str]]:
    """The small table: (what, which) for each metric's pace to its target and the breakdown's
    largest contributor, dominant row and rows against the total; [] where there are none."""
    out = [(f"{m['metric']}: pace to target", f"{percent(m['pace'])} of the way from {m['prev']} to {m['target']}")
           for m in d["metrics"] if m["pace"] is not None]
    b = d.get("breakdown")
    if b is not None:
        rows = {r["name"]: r for r in b["rows"]}
        if b["largest"] is not None:  # the largest of all only where the rows cover the change (a result
            # stored before drivers said `covers` has their deltas: the same sum)
            covers = sum((Decimal(r["delta"]) for r in b["rows"]), Decimal(0)) == Decimal(b["delta"])
            of = "to the change" if covers else "of the rows shown"
            out.append((f"{b['metric']}: largest contributor {of}",
                        f"{b['largest']} ({percent(rows[b['largest']]['share_of_delta'])} of {signed(b['delta'])})"))
        if b["dominant_delta"] is not None:
            out.append((f"{b['metric']}: more than half of the change", b["dominant_delta"]))
        if b["dominant_value"] is not None:
            out.append((f"{b['metric']}: more than half of the value",
                        f"{b['dominant_value']} ({percent(rows[b['dominant_value']]['share_of_value'])})"))
        if b["against"]:
            out.append((f"{b['metric']}: moved against the change",
                        ", ".join(f"{n} ({signed(rows[n]['delta'])})" for n in b["against"])))
    return out


def metric_table(d: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Every metric driver: (header, rows)."""
    head = ["metric", "value", "prev", "change", "target", "pace to target"]
    return head, [[f"{m['metric']} ({m['unit']})", m["value"], m["prev"], signed(m["delta"]), m["target"] or "—",
                   percent(m["pace"])] for m in d["metrics"]]


def breakdown_table(d: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """The breakdown with every row's drivers: (header, rows); None without one."""
    b = d.get("breakdown")
    if b is None:
        return None
    head = [b["kind"], "value", "prev", "change", "share of change", "share of value"]
    return head, [[r["name"], r["value"], r["prev"], signed(r["delta"]), percent(r["share_of_delta"]),
                   percent(r["share_of_value"])] for r in b["rows"]]


# ---- Markdown ---------------------------------------------------------------------------------


#: emphasis, code, links, raw HTML, entities, a table's pipe, a heading's marks (at a line's start,
#: and a heading's closing ones: "Team #" in a title would lose its "#")
_INLINE = re.compile(r"([\\`*_\[\]<>|~&!#])")
_LINE_START = re.compile(r"^([ \t]*)([-+=]|\d+(?=[.)]))", re.MULTILINE)  # a list, an underline


def _md(x: str, block: bool = True) -> str:
    """Text (a name, a title, the model's sentences) as Markdown that renders as the text itself:
    a tenant's "net_revenue_usd" or "<b>Acme</b>" is no emphasis and no HTML.  The ASCII
    punctuation Markdown reads is escaped with a backslash (CommonMark's escapes); a block's
    lines also where they would start a heading or a list (not a table's cells: "+44" stays)."""
    x = _INLINE.sub(r"\\\1", x)
    if not block:
        return x.replace("\n", " ")
    return _LINE_START.sub(lambda m: m[1] + (m[2] + "\\" if m[2][0].isdigit() else "\\" + m[2]), x)


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(_md(c, block=False) for c in cells) + " |"
    return "\n".join([line(head), "|" + " --- |" * len(head), *map(line, rows)])


def markdown(doc: Document) -> str:
    """The document as Markdown: text and tables (a chart is a picture: the HTML and PDF have
    them, the JSON their specs)."""
    out = [f"# {_md(doc.title)}", f"*{_md(doc.subtitle)}*", *(f"> {_md(n)}" for n in doc.notes)]
    if doc.detail == "summary" and doc.figures is not None:
        out += ["## Key figures", _md(doc.figures)]
    for part in doc.parts:
        if doc.detail == "summary" and doc.figures is not None:
            break  # the key figures are the summary (the charts are pictures: HTML and PDF)
        if part.title is not None:
            out.append(f"## {_md(part.title)}")
        if doc.detail == "summary":
            out.append(_md(first_sentence(part.payload, part.text)))
            continue
        out.append(_md(part.text))
        main = main_drivers(part.drivers)
        if main:
            out.append(_md_table(["driver", ""], [list(x) for x in main]))
        if doc.detail == "full":
            out.append(_md_table(*metric_table(part.drivers)))
            b = breakdown_table(part.drivers)
            if b is not None:
                out.append(_md_table(*b))
    if doc.detail != "summary" and doc.figures is not None:
        out += ["## Key figures", _md(doc.figures)]
    return "\n\n".join(out) + "\n"


# ---- HTML -------------------------------------------------------------------------------------

#: the page's only style; system fonts only (no font is fetched): DejaVu for Latin, Greek,
#: Cyrillic, Arabic and Hebrew, Noto CJK for Chinese, Japanese and Korean where installed
CSS = """
@page { size: A4; margin: 16mm 14mm; }
body { font-family: "DejaVu Sans", "Noto Sans", "Noto Sans CJK JP", sans-serif; font-size: 10.5pt; line-height: 1.45;
       color: #1d232b; max-width: 760px; margin: 0 auto; padding: 12px; }
h1 { font-size: 18pt; margin: 0 0 2px; } h2 { font-size: 13pt; margin: 18px 0 6px; border-bottom: 1px solid #dde1e6; }
.sub { color: #5b6674; margin: 0 0 10px; } .note { color: #b42318; }
figure { margin: 8px 0; break-inside: avoid; } figure svg, figure img { max-width: 100%; height: auto; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 9.5pt; break-inside: avoid; }
th, td { text-align: left; padding: 2px 8px; border-bottom: 1px solid #eef0f3; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
section { break-inside: auto; }
"""


def _esc(x: str) -> str:
    return html.escape(x, quote=True)


def _html_table(head: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    th = "".join(f"<th>{_esc(h)}</th>" for h in head)
    cls = [' class="n"' if i >= numeric_from else "" for i in range(len(head))]
    body = "".join("<tr>" + "".join(f'<td dir="auto"{cls[i]}>{_esc(c)}</td>' for i, c in enumerate(r)) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


_XML_DECL = re.compile(r"^\s*<\?xml[^>]*>\s*")


def html_page(doc: Document, svg: Callable[[dict[str, Any]], str]) -> str:
    """The document as one self-contained HTML page: the style inline, each chart inline as the
    SVG `svg(spec)` renders (no URL anywhere: nothing to fetch, so it opens offline and renders
    to PDF as it is); every text escaped."""
    body = [f"<h1 dir=\"auto\">{_esc(doc.title)}</h1>", f"<p class=\"sub\" dir=\"auto\">{_esc(doc.subtitle)}</p>",
            *(f"<p class=\"note\">{_esc(n)}</p>" for n in doc.notes)]
    if doc.detail == "summary" and doc.figures is not None:
        body.append(f"<section><h2>Key figures</h2><p dir=\"auto\">{_esc(doc.figures)}</p></section>")
    for part in doc.parts:
        sec = [f"<h2 dir=\"auto\">{_esc(part.title)}</h2>"] if part.title is not None else []
        if doc.detail != "summary":
            sec.append(f"<p dir=\"auto\">{_esc(part.text)}</p>")
        elif doc.figures is None:
            sec.append(f"<p dir=\"auto\">{_esc(first_sentence(part.payload, part.text))}</p>")
        sec.append(f"<figure>{_XML_DECL.sub('', svg(part.chart))}</figure>")
        if doc.detail != "summary":
            main = main_drivers(part.drivers)
            if main:
                sec.append(_html_table(["driver", ""], [list(x) for x in main], numeric_from=2))
        if doc.detail == "full":
            sec.append(_html_table(*metric_table(part.drivers)))
            b = breakdown_table(part.drivers)
            if b is not None:
                sec.append(_html_table(*b))
        body.append("<section>" + "\n".join(sec) + "</section>")
    if doc.detail != "summary" and doc.figures is not None:
        body.append(f"<section><h2>Key figures</h2><p dir=\"auto\">{_esc(doc.figures)}</p></section>")
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{_esc(doc.title)}</title>\n"
            f"<style>{CSS}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")
