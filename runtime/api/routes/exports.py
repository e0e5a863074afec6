"""/v1/jobs/{id}/report.{fmt}: a finished narrative's or report's Markdown, HTML, PDF and JSON
(rendered by runtime/api/exports.py)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from runtime.api import exports
from runtime.api.deps import JobId, Svc, Tenant
from runtime.api.models import ERRORS
from runtime.jobs.specs import Detail

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

EXPORT_TYPES: dict[int | str, dict[str, Any]] = {200: {"content": {media: {} for media, _ in exports.FORMATS.values()},
                                                      "description": "the report in the format the path names"}}


@router.get("/{job_id}/report.{fmt}", responses={**ERRORS, **EXPORT_TYPES})
def job_report(job_id: JobId, fmt: Literal["md", "html", "pdf", "json"], who: Tenant, svc: Svc,
               detail: Annotated[Detail | None, Query(description="what the export shows; default: the job's own")] = None
               ) -> Response:
    """A succeeded narrative or report job's report: `md` (text and tables), `html` (one
    self-contained page: the style and the charts inline as SVG, no URL to fetch), `pdf` (that
    page through WeasyPrint), `json` (the result with each part's Vega-Lite chart spec and its
    drivers).  `detail` (summary, standard, full; default the job's) chooses what it shows, not
    what the model wrote.  404 for another kind of job, one that failed or was cancelled, or
    another tenant's; 409 not_finished while it is queued, running or waiting.  A sync route:
    rendering is CPU work, done on a worker thread, never on the event loop.  Each takes a
    rate-limit token; a rendering is kept (a finished job's export does not change) and served
    with a sandbox CSP and nosniff: a page from the API's origin runs nothing."""
    svc.limiter.take(who)
    job = svc.jobs.get(job_id, who)
    exports.exportable(job)
    media, _ = exports.FORMATS[fmt]

    def render() -> str | bytes:
        if fmt == "json":
            return json.dumps(exports.result(job), ensure_ascii=False)
        if fmt == "md":
            return exports.markdown(job, detail)
        return exports.html(job, detail) if fmt == "html" else exports.pdf(exports.html(job, detail, exports.pdf_chart))

    body = exports.RENDERED.get((job.id, fmt, detail), render)
    return Response(body, media_type=media, headers={"Content-Disposition": exports.filename(job, fmt), **exports.HEADERS})
