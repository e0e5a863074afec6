"""GET /v1/jobs/{id}/report.{md,html,pdf,json} on an app with SQLite and the test Redis: job rows
whose results are written through the job store, as a worker leaves them (texts the narrative's
forms write, facts in place; no worker runs).  The HTML is one self-contained page with its
charts inline as SVG; the PDF, rasterised with pdfium, shows them (the charts' blue is on its
pages); JSON is the result with chart specs and drivers; 404 and 409 where there is no report."""

from __future__ import annotations

import io
import json
import random
import re
from typing import Any

import numpy as np
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pytest

from domain import charts, drivers
from domain.narrative import narrative
from domain.report import Section, section_text
from runtime.jobs.specs import NarrativeSpec, ReportSpec
from tests.runtime.api.conftest import ACME, AGENT, DATA, GLOBEX, NARRATIVE, REPORT, Api
from workflows.report import section_payload

WORLD = {**DATA, "tenant": "東京商事", "breakdown": {"kind": "region", "metric": "revenue", "rows": [
    ["EMEA", "512", "468"], ["الشرق الأوسط", "301", "318"], ["関東", "427", "319"]]}}
BLUE = (0x3A, 0x7B, 0xD5)  # the value bars' colour (domain/charts.py COLORS)


def narrative_result(spec: dict[str, Any], *, old: bool = False) -> dict[str, Any]:
    """What workflows/narrative.py returns for spec (old: as results were before they carried charts)."""
    parsed = NarrativeSpec.model_validate(spec)
    p = parsed.payload.to_payload()
    text = p.render().slots.lexicalise(narrative(random.Random(1), p))
    out: dict[str, Any] = {"session": "s", "text": text, "facts_ok": 9, "facts_total": 9, "verified": True,
                           "attempt": "first", "problems": []}
    if not old:
        out |= {"chart": charts.chart(p, f"{p.tenant}, {p.period}"), "drivers": drivers.drivers(p),
                "detail": parsed.detail, "audience": parsed.audience}
    return out


def report_result(spec: dict[str, Any]) -> dict[str, Any]:
    """What workflows/report.py returns for spec."""
    parsed = ReportSpec.model_validate(spec)
    data = parsed.data.to_payload()
    rng = random.Random(2)
    sections = []
    for item in parsed.outline:
        p = section_payload(data, list(item.metrics))
        s = Section(item.title, p)
        md = s.render()[2].slots.lexicalise(section_text(rng, s))
        sections.append({"title": item.title, "markdown": md, "verified": True, "attempt": "first", "problems": [],
                         "chart": charts.chart(p, item.title), "drivers": drivers.drivers(p)})
    figures = {"markdown": "Revenue: 1240 k USD (up; previous 1105; target 1300, below).", "exact": True, "verified": True}
    return {"session": "s", "title": parsed.title, "markdown": "", "html": "", "sections": sections, "figures": figures,
            "verified": True, "attempt": "first", "detail": parsed.detail, "audience": parsed.audience}


def seed(api: Api, kind: str, spec: dict[str, Any], status: str = "succeeded", result: dict[str, Any] | None = None,
         tenant: str = "acme") -> str:
    """A job row as a worker leaves it: queued, running (claimed), or ended with `result`."""
    job, _ = api.svc.jobs.create(kind, tenant, spec, None, "interactive", open_session=True)
    if status == "queued":
        return job.id
    owner = api.svc.jobs.claim(job.id, "test-worker").owner
    assert owner is not None
    if status != "running":
        api.svc.jobs.finish(job.id, owner, status, result=result,
                            error=None if status == "succeeded" else {"code": "unverified", "message": "x"})
    return job.id


def get(api: Api, job: str, fmt: str, headers: dict[str, str] = ACME, **params: str) -> Any:
    return api.http.get(f"/v1/jobs/{job}/report.{fmt}", headers=headers, params=params)


REPORT6: dict[str, Any] = {
    "title": "Quarterly review", "data": WORLD, "audience": "the board", "detail": "standard",
    "outline": [{"title": t, "metrics": m} for t, m in (
        ("Revenue", ["revenue"]), ("Customer health", ["churn"]), ("Platform", ["latency"]),
        ("売上と解約", ["revenue", "churn"]), ("Mix", ["churn", "latency"]), ("All", ["latency", "revenue"]))]}


@pytest.fixture
def report_job(api: Api) -> str:
    return seed(api, "report", REPORT6, result=report_result(REPORT6))


def test_json_is_the_result_with_charts_and_drivers(api: Api, report_job: str) -> None:
    r = get(api, report_job, "json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.headers["content-disposition"].startswith('attachment; filename="quarterly-review-')
    body = r.json()
    assert body["detail"] == "standard" and body["audience"] == "the board" and len(body["sections"]) == 6
    for sec in body["sections"]:
        assert sec["chart"]["$schema"].endswith("vega-lite/v6.json") and sec["drivers"]["metrics"]
    assert body["sections"][0]["drivers"]["breakdown"]["largest"] == "関東"
    assert body["sections"][0]["drivers"]["breakdown"]["against"] == ["الشرق الأوسط"]


def test_markdown_has_the_text_and_the_driver_tables(api: Api, report_job: str) -> None:
    r = get(api, report_job, "md")
    assert r.status_code == 200 and r.headers["content-type"] == "text/markdown; charset=utf-8"
    md = r.text
    assert md.startswith("# Quarterly review\n\n*Report · 東京商事, 2026-Q3 · for the board*")
    for title in ("Revenue", "Customer health", "売上と解約", "Key figures"):
        assert f"\n## {title}\n" in md
    assert "| Revenue: largest contributor to the change | 関東 (80.00% of +135) |" in md
    assert "share of change" not in md  # standard: the main drivers only
    full = get(api, report_job, "md", detail="full").text
    assert "| الشرق الأوسط | 301 | 318 | -17 | -12.59% | 24.27% |" in full
    summary = get(api, report_job, "md", detail="summary").text
    assert "## Key figures" in summary and "## Revenue" not in summary


def test_html_is_one_self_contained_page_with_its_charts(api: Api, report_job: str) -> None:
    r = get(api, report_job, "html")
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.headers["content-disposition"].startswith("inline; filename=")
    page = r.text
    assert page.count("<svg") == 6 and page.count("</svg>") == 6  # a chart per section, inline
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)  # nothing to fetch
    assert not re.search(r"<(?:script|link|img|iframe|object)\b", page, re.I) and "url(" not in page
    assert "@import" not in page and "<style>" in page
    for name in ("東京商事", "الشرق الأوسط", "関東", "売上と解約"):
        assert name in page, name
    # the chart's own text, in its SVG: a name in another script is text there too
    svg = page[page.index("<svg"): page.index("</svg>")]
    assert "الشرق الأوسط" in svg and "関東" in svg


def test_pdf_renders_its_charts(api: Api, report_job: str) -> None:
    r = get(api, report_job, "pdf")
    assert r.status_code == 200 and r.headers["content-type"] == "application/pdf" and r.content.startswith(b"%PDF-")
    name, utf8 = r"quarterly-review-[0-9a-f]{8}\.pdf", r"Quarterly%20review-[0-9a-f]{8}\.pdf"
    assert re.fullmatch(f"inline; filename=\"{name}\"; filename\\*=UTF-8''{utf8}", r.headers["content-disposition"])
    pdf = pdfium.PdfDocument(io.BytesIO(r.content))
    try:
        pages = [np.asarray(pdf[i].render(scale=0.5).to_pil().convert("RGB"), dtype=np.int16) for i in range(len(pdf))]
    finally:
        pdf.close()
    assert len(pages) >= 2
    blue_pages = 0
    for i, px in enumerate(pages):  # (H, W, 3)
        ink = float((px.sum(axis=2) < 3 * 235).mean())
        assert ink > 0.01, f"page {i + 1} is blank ({ink:.4f} of it inked)"
        blue = int((np.abs(px - np.array(BLUE)) <= 30).all(axis=2).sum())
        blue_pages += blue > 100
    assert blue_pages >= 2, blue_pages  # the charts' bars are drawn (6 sections, a chart each, over the pages)


def test_a_narrative_exports_at_its_own_detail(api: Api) -> None:
    spec = {**NARRATIVE, "payload": WORLD, "detail": "summary", "audience": "regional leads"}
    job = seed(api, "narrative", spec, result=narrative_result(spec))
    md = get(api, job, "md").text
    text = narrative_result(spec)["text"]
    assert md.startswith("# 東京商事, 2026-Q3\n\n*Narrative · for regional leads*")
    assert text not in md and "Revenue " in md and "Churn" not in md  # summary: the first sentence
    page = get(api, job, "html").text
    assert page.count("<svg") == 1 and "<table>" not in page
    full = get(api, job, "html", detail="full").text
    assert full.count("<table>") == 3 and text.split(". ")[-1] in full
    assert get(api, job, "md", detail="standard").text.count(text) == 1
    assert get(api, job, "pdf").content.startswith(b"%PDF-")


def test_a_result_from_before_charts_gets_them_from_its_spec(api: Api) -> None:
    job = seed(api, "narrative", NARRATIVE, result=narrative_result(NARRATIVE, old=True))
    body = get(api, job, "json").json()
    assert body["chart"] == charts.chart(NarrativeSpec.model_validate(NARRATIVE).payload.to_payload(), "Northwind, 2026-Q3")
    assert body["drivers"]["breakdown"]["largest"] == "AMER" and body["detail"] == "standard" and body["audience"] is None
    assert get(api, job, "html").text.count("<svg") == 1


def test_no_report_404_and_not_yet_409(api: Api) -> None:
    done = seed(api, "report", REPORT, result=report_result(REPORT))
    cases = [(seed(api, "report", REPORT, status="queued"), 409, "not_finished"),
             (seed(api, "narrative", NARRATIVE, status="running"), 409, "not_finished"),
             (seed(api, "narrative", NARRATIVE, status="failed"), 404, "not_found"),
             (seed(api, "agent", AGENT, result={"answer": "2.4"}), 404, "not_found"),  # no report for its kind
             ("0123456789abcdef01234567", 404, "not_found")]
    before = api.snapshot()
    for job, status, code in cases:
        for fmt in ("md", "html", "pdf", "json"):
            r = get(api, job, fmt)
            assert r.status_code == status and r.json()["error"]["code"] == code, (fmt, r.text)
    for fmt in ("md", "json"):  # another tenant's: not there
        r = get(api, done, fmt, headers=GLOBEX)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert get(api, done, "md", headers={}).status_code == 401
    assert api.http.get(f"/v1/jobs/{done}/report.docx", headers=ACME).status_code in (404, 422)
    assert get(api, done, "md", detail="everything").status_code == 422
    assert api.snapshot() == before  # reading wrote nothing


def test_the_openapi_schema_names_the_formats(api: Api) -> None:
    op = api.http.get("/openapi.json").json()["paths"]["/v1/jobs/{job_id}/report.{fmt}"]["get"]
    assert set(op["responses"]["200"]["content"]) == {"text/markdown; charset=utf-8", "text/html; charset=utf-8",
                                                      "application/pdf", "application/json"}
    assert json.dumps(op).count("summary") >= 1


def test_names_are_text_never_markup(api: Api) -> None:
    """A name may hold any character (the payload grammar): in the page and its SVG it is
    escaped, in Markdown tables its pipe too."""
    evil = "<img src=x onerror=alert(1)>"
    data = {**DATA, "tenant": 'A&B "co" <b>', "breakdown": {"kind": "region", "metric": "revenue", "rows": [
        [evil, "512", "468"], ["West | East", "301", "318"], ["AMER", "427", "319"]]}}
    spec = {**NARRATIVE, "payload": data, "detail": "full"}
    job = seed(api, "narrative", spec, result=narrative_result(spec))
    page = get(api, job, "html").text
    assert "<img" not in page and "<b>" not in page and "onerror=alert(1)&gt;" in page
    assert "A&amp;B &quot;co&quot; &lt;b&gt;" in page
    assert not re.search(r"""(?:src|href)\s*=""", page.replace("&lt;img src=x", ""), re.I)
    md = get(api, job, "md").text
    assert "| West \\| East | 301 | 318 | -17 |" in md


RTL = {**DATA, "tenant": "שרכת נתונים", "breakdown": {"kind": "region", "metric": "revenue", "rows": [
    ["الرياض", "900", "600"], ["جدة", "600", "600"]]}}


def _images(pdf_bytes: bytes) -> int:
    pdf = pdfium.PdfDocument(io.BytesIO(pdf_bytes))
    try:
        return sum(1 for page in pdf for obj in page.get_objects() if obj.type == pdfium_c.FPDF_PAGEOBJ_IMAGE)
    finally:
        pdf.close()


def test_a_pdfs_charts_in_a_right_to_left_script_are_drawn_by_vl_convert(api: Api) -> None:
    """WeasyPrint drew an SVG's Arabic and Hebrew text in stored order, unjoined ("الرياض" as
    "ضايرل"): a chart whose text holds such a script is drawn by vl-convert (which orders and
    joins it) as a PNG in the PDF; a chart in a left-to-right script stays vector.  (Checked by
    eye too: the rendered page reads as the names are written.)"""
    rtl = seed(api, "narrative", {**NARRATIVE, "payload": RTL, "detail": "full"},
               result=narrative_result({**NARRATIVE, "payload": RTL, "detail": "full"}))
    latin = seed(api, "narrative", {**NARRATIVE, "detail": "full"}, result=narrative_result({**NARRATIVE, "detail": "full"}))
    assert _images(get(api, rtl, "pdf").content) >= 1
    assert _images(get(api, latin, "pdf").content) == 0
    assert get(api, rtl, "html").text.count("<svg") >= 1  # the HTML keeps its SVG: browsers order the text


def test_exports_are_served_as_data_take_a_token_and_render_once(make_api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.api import exports
    api = make_api(tenant_burst=3, tenant_rate_per_s=0.01)
    job = seed(api, "report", REPORT6, result=report_result(REPORT6))
    calls: list[str] = []
    real = exports.markdown
    monkeypatch.setattr(exports, "markdown", lambda j, d=None: calls.append(j.id) or real(j, d))
    first, again = get(api, job, "md"), get(api, job, "md")
    assert first.status_code == again.status_code == 200 and first.text == again.text and calls == [job]
    for r in (first, get(api, job, "html")):
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in r.headers["content-security-policy"] and "default-src 'none'" in r.headers["content-security-policy"]
    refused = get(api, job, "md")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
