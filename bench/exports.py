"""A report's exports: the time to render its HTML page (a chart per section, vl-convert) and its
PDF (that page through WeasyPrint), per section, at each detail level.

    python bench/exports.py [--quick] [--repeats R] [--sections N ...]

A report job's row as a worker leaves it (runtime/tables.JobRecord, in memory: no database, no
worker), its sections written by the narrative's own forms over the sample data's metrics, each
section with its chart and drivers; rendered by runtime/api/exports.py, what the route runs.
The first render of a process is reported apart (vl-convert starts its JavaScript runtime, and
WeasyPrint is imported, on first use); then the median of R renders per size and level, and
per section.  The PDF time is the PDF alone, from the HTML already rendered (the route does both:
add them).  Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from domain import charts, drivers  # noqa: E402
from domain.report import Section, section_text  # noqa: E402
from runtime.api import exports  # noqa: E402
from runtime.jobs.specs import ReportSpec  # noqa: E402
from runtime.tables import JobRecord  # noqa: E402
from workflows.report import section_payload  # noqa: E402

DATA = {"tenant": "Northwind", "period": "2026-Q3", "style": "formal",
        "metrics": [{"key": "revenue", "value": "1240", "prev": "1105", "target": "1300"},
                    {"key": "churn", "value": "2.4", "prev": "2.6", "target": "2.5"},
                    {"key": "latency", "value": "182", "prev": "190"},
                    {"key": "orders", "value": "15120", "prev": "14410", "target": "16000"}],
        "breakdown": {"kind": "region", "metric": "revenue",
                      "rows": [["EMEA", "512", "468"], ["APAC", "301", "318"], ["AMER", "427", "319"]]}}
OUTLINE = [("Revenue", ["revenue"]), ("Customer health", ["churn"]), ("Platform", ["latency"]),
           ("Orders", ["orders", "revenue"]), ("Retention", ["churn", "orders"]), ("Overview", ["latency", "revenue"])]


def job(n: int) -> JobRecord:
    """A succeeded report job of n sections (n <= 6), its result as workflows/report.py writes it."""
    spec = {"title": "Quarterly review", "data": DATA, "outline": [{"title": t, "metrics": m} for t, m in OUTLINE[:n]]}
    parsed = ReportSpec.model_validate(spec)
    data = parsed.data.to_payload()
    rng = random.Random(n)
    sections: list[dict[str, Any]] = []
    for item in parsed.outline:
        p = section_payload(data, list(item.metrics))
        s = Section(item.title, p)
        sections.append({"title": item.title, "markdown": s.render()[2].slots.lexicalise(section_text(rng, s)),
                         "verified": True, "chart": charts.chart(p, item.title), "drivers": drivers.drivers(p)})
    result = {"title": parsed.title, "sections": sections, "verified": True, "detail": "standard", "audience": None,
              "figures": {"markdown": "Revenue: 1240 k USD (up; previous 1105; target 1300, below)."}}
    return JobRecord(id="0" * 24, kind="report", tenant="bench", spec=spec, result=result, status="succeeded")


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one render per size and level")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sections", type=int, nargs="+", default=[1, 6])
    args = ap.parse_args(argv)
    if args.repeats < 1 or not all(1 <= n <= len(OUTLINE) for n in args.sections):
        ap.error(f"--repeats >= 1; --sections each 1-{len(OUTLINE)}")
    repeats = 1 if args.quick else args.repeats
    first_html, page = timed(exports.html, job(1), "standard")
    first_pdf, _ = timed(exports.pdf, page)
    rows = []
    print(f"{'sections':>8} {'detail':>8} {'html s':>8} {'pdf s':>8} {'html/sec':>9} {'pdf/sec':>9} {'html KB':>8} {'pdf KB':>7}")
    for n in args.sections:
        record = job(n)
        for detail in ("standard", "full"):
            html_s, pdf_s = [], []
            for _ in range(repeats):
                t, page = timed(exports.html, record, detail)
                html_s.append(t)
                t, pdf = timed(exports.pdf, page)
                pdf_s.append(t)
            h, p = statistics.median(html_s), statistics.median(pdf_s)
            row = {"sections": n, "detail": detail, "html_s": round(h, 3), "pdf_s": round(p, 3),
                   "html_per_section_s": round(h / n, 3), "pdf_per_section_s": round(p / n, 3),
                   "html_bytes": len(page.encode()), "pdf_bytes": len(pdf)}
            rows.append(row)
            print(f"{n:>8} {detail:>8} {h:>8.3f} {p:>8.3f} {h / n:>9.3f} {p / n:>9.3f} {len(page.encode()) / 1e3:>8.1f} "
                  f"{len(pdf) / 1e3:>7.1f}")
    result = {"bench": "exports", "repeats": repeats, "first_html_s": round(first_html, 3),
              "first_pdf_s": round(first_pdf, 3), "rows": rows}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
