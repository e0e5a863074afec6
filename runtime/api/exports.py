"""A finished narrative's or report's exports: Markdown, one self-contained HTML page (charts
inline as SVG), PDF from that page, and JSON (the result with its chart specs and drivers).
Charts: the Vega-Lite specs rendered by vl-convert (no browser, nothing fetched); PDF:
WeasyPrint, which fetches nothing either.  CPU work: callers run it off the event loop.
What each detail level shows is domain/document.py's; this reads the job and renders."""

from __future__ import annotations

import base64
import json
import re
import struct
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import vl_convert

from domain import charts, document, drivers
from domain.grammar import canonical
from runtime.errors import NotFinished, NotFound
from runtime.jobs.specs import NarrativeSpec, ReportSpec
from runtime.tables import JobRecord
from workflows.report import section_payload

KINDS = ("narrative", "report")
#: format -> (media type, disposition): the page and the PDF open in a browser, the others download
FORMATS = {"md": ("text/markdown; charset=utf-8", "attachment"), "html": ("text/html; charset=utf-8", "inline"),
           "pdf": ("application/pdf", "inline"), "json": ("application/json", "attachment")}
VEGA_LITE = "6.4"  # vl-convert's bundled Vega-Lite that renders domain/charts.py's specs (v6)
#: every export is served as data: no script runs, nothing is fetched, the type is not sniffed
HEADERS = {"Content-Security-Policy": "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src data:",
           "X-Content-Type-Options": "nosniff"}


class Rendered:
    """Renderings kept in the process, the most recent first out of MAX_BYTES: a finished job's
    export does not change, so it is rendered once per (job, format, detail)."""

    MAX_BYTES = 64 * 1024 * 1024

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[str, str, str | None], str | bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str | None], render: Callable[[], str | bytes]) -> str | bytes:
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        out = render()
        with self._lock:
            if key not in self._kept and len(out) <= self.MAX_BYTES:
                self._kept[key] = out
                self._bytes += len(out)
                while self._bytes > self.MAX_BYTES:
                    self._bytes -= len(self._kept.popitem(last=False)[1])
        return out


RENDERED = Rendered()


def exportable(job: JobRecord) -> None:
    """NotFound for a job that has no report: another kind, or one that ended without success;
    NotFinished while it may still have one (queued, running, waiting for tool outputs)."""
    if job.kind not in KINDS:
        raise NotFound(f"job {job.id} is a {job.kind} job: only narrative and report jobs have a report")
    if job.status in ("queued", "running", "requires_action"):
        raise NotFinished(f"job {job.id} is {job.status}: its report is there once it has succeeded")
    if job.status != "succeeded" or job.result is None:
        raise NotFound(f"job {job.id} {job.status}: it has no report")


def result(job: JobRecord) -> dict[str, Any]:
    """The job's result with each part's chart and drivers, and the detail and audience (a job
    that finished before results carried them gets them from its spec, as its workflow computes them)."""
    out = dict(job.result or {})
    if job.kind == "narrative":
        n = NarrativeSpec.model_validate(job.spec)
        p = n.payload.to_payload()
        out.setdefault("chart", charts.chart(p, f"{p.tenant}, {p.period}"))
        out.setdefault("drivers", drivers.drivers(p))
        spec_detail, audience = n.detail, n.audience
    else:
        r = ReportSpec.model_validate(job.spec)
        data = r.data.to_payload()
        sections = []
        for item, sec in zip(r.outline, out.get("sections") or []):
            p = section_payload(data, list(item.metrics))
            sections.append({**sec, "chart": sec.get("chart") or charts.chart(p, item.title),
                             "drivers": sec.get("drivers") or drivers.drivers(p)})
        out["sections"] = sections
        spec_detail, audience = r.detail, r.audience
    out.setdefault("detail", spec_detail)
    out.setdefault("audience", audience)
    return out


def build(job: JobRecord, detail: str | None = None) -> document.Document:
    """The job's document at `detail` (None: the job's own level)."""
    res = result(job)
    level = detail or res["detail"]
    if job.kind == "narrative":
        p = NarrativeSpec.model_validate(job.spec).payload.to_payload()
        parts = [document.Part(None, res.get("text", ""), p, res["chart"], res["drivers"])]
        title, figures = f"{p.tenant}, {p.period}", None
        meta = [] if res.get("audience") is None else [f"for {res['audience']}"]
    else:
        r = ReportSpec.model_validate(job.spec)
        data = r.data.to_payload()
        parts = [document.Part(item.title, _body(sec.get("markdown", ""), item.title),
                               section_payload(data, list(item.metrics)), sec["chart"], sec["drivers"])
                 for item, sec in zip(r.outline, res["sections"])]
        title, figures = r.title, (res.get("figures") or {}).get("markdown")
        meta = [f"{data.tenant}, {data.period}"] + ([] if res.get("audience") is None else [f"for {res['audience']}"])
    subtitle = " · ".join(["Narrative" if job.kind == "narrative" else "Report", *meta])
    notes = [] if res.get("verified", True) else ["Some of this text failed its fact check (allow_unverified): "
                                                  "read it against the tables."]
    return document.Document(title, subtitle, level, parts, figures, notes)


def _body(markdown: str, title: str) -> str:
    """A section's text without its heading line."""
    head = f"## {title}\n"
    return markdown[len(head):] if markdown.startswith(head) else markdown


def svg(spec: dict[str, Any]) -> str:
    """A Vega-Lite spec as SVG; text stays text (any script; shown in whatever font the viewer has)."""
    return vl_convert.vegalite_to_svg(spec, vl_version=VEGA_LITE, allowed_base_urls=[])


def pdf_chart(spec: dict[str, Any]) -> str:
    """A chart as the PDF draws it: its SVG, but a PNG (twice the pixels, shown at its size) where
    its text holds a right-to-left script: WeasyPrint draws an SVG's text in its stored order,
    unjoined ("الرياض" came out as "ضايرل"), where vl-convert's own renderer orders and joins it."""
    text = json.dumps(spec, ensure_ascii=False)
    if not any(unicodedata.bidirectional(c) in ("R", "AL") for c in text):
        return svg(spec)
    png = vl_convert.vegalite_to_png(spec, vl_version=VEGA_LITE, scale=2, allowed_base_urls=[])
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk's
    return (f'<img alt="chart" width="{width // 2}" height="{height // 2}" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')


def html(job: JobRecord, detail: str | None = None, chart: Callable[[dict[str, Any]], str] = svg) -> str:
    return document.html_page(build(job, detail), chart)


def markdown(job: JobRecord, detail: str | None = None) -> str:
    return document.markdown(build(job, detail))


def pdf(page: str) -> bytes:
    """An HTML page (html()) as PDF; WeasyPrint may fetch nothing but an inline data: URL."""
    import weasyprint  # imported on the first PDF: a second's import the API's start does not pay

    fetcher = weasyprint.URLFetcher(allowed_protocols=["data"])  # a chart drawn as PNG (pdf_chart) is inline
    out: bytes = weasyprint.HTML(string=page, url_fetcher=fetcher).write_pdf()
    return out


def filename(job: JobRecord, fmt: str) -> str:
    """Content-Disposition's value: an ASCII name (the title's letters and digits, then the job's
    id) and the title in UTF-8 (RFC 6266 filename*)."""
    title = str((job.result or {}).get("title") or job.kind)
    ascii_ = re.sub(r"[^A-Za-z0-9]+", "-", unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode())
    base = f"{ascii_.strip('-').lower()[:60] or job.kind}-{job.id[:8]}.{fmt}"
    utf8 = f"{canonical(title)[:80]}-{job.id[:8]}.{fmt}"
    return f"{FORMATS[fmt][1]}; filename=\"{base}\"; filename*=UTF-8''{quote(utf8, safe='')}"
