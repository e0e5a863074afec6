"""Reports.  `fill` fills one report template by infill over a bare model (benchmarks, the model
tour): the template's text (and its payload) is the context, its holes are masks decoded in
place; positions never shift.  `job` is the `report` job kind: a section per outline item, each
a turn of one session, then the key-figures template filled by infill in the same session; the
report as Markdown and HTML, progress after each section."""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Any

import torch

from model.corpus.report import Section, Template, check_section, infill_tokens
from model.params import DecodeParams
from model.decode import begin_infill, decode
from model.kv_cache import KVCache
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.jobs.context import JobContext
from runtime.jobs.plans import check_fits, report_template, section_input, section_payload
from runtime.jobs.specs import ReportSpec, check_spec
from workflows.turn import decode_params, session_of, summary


@dataclass
class FillResult:
    tokens: list[int]  # the filled sequence
    reference: list[int]  # the template filled with its own answers
    hole: list[bool]  # which positions were holes
    nfe: int  # forward passes, the context's prefill included
    seconds: float

    @property
    def exact(self) -> bool:
        return self.tokens == self.reference


@torch.no_grad()
def fill(model: SetDLM, tok: Tokenizer, template: Template, params: DecodeParams) -> FillResult:
    t0 = time.perf_counter()
    ids, hole = infill_tokens(tok, template)
    w = next(model.parameters())
    cache = KVCache.for_model(model.cfg, dtype=w.dtype, device=w.device)
    state = begin_infill(model, cache, [model.cfg.mask_id if h else x for x, h in zip(ids, hole)])
    for _ev in decode(model, cache, state, params):
        pass
    return FillResult(state.tokens, ids, hole, state.nfe, time.perf_counter() - t0)


# ---- the report job ---------------------------------------------------------------------------


def job(ctx: JobContext, spec: dict[str, Any]) -> dict[str, Any]:
    """Each outline item is a section, written as a turn of the job's session (the earlier
    sections stay in its cache; each is a document of its own, model/masks.py); then the
    key-figures template is filled by infill, a turn too.  The whole plan is checked against
    the model's context before the first section.  Progress after each section: {"section":
    sections done, "sections": n, "title": the last one done}."""
    s = check_spec("report", spec, ctx.job.session_id)
    assert isinstance(s, ReportSpec)
    session, tok, cfg = session_of(ctx), ctx.tokenizer, ctx.engine.model.cfg
    # the session without this job's own turns (a rerun has written some already): the plan counts them
    check_fits("report", s, tok, ctx.engine.records.length(session, ctx.job.tenant, except_jobs={ctx.job.id}),
               cfg.max_seq_len)
    data = s.data.to_payload()
    n = len(s.outline) + int(s.summary)
    ctx.report(section=0, sections=n, title=None)
    sections: list[dict[str, Any]] = []
    for i, item in enumerate(s.outline):
        payload = section_payload(data, list(item.metrics))
        ids, text_in = section_input(tok, item.title, payload)
        r = ctx.turn(session, ids, decode_params(s.params), text=text_in)
        text = f"## {item.title}\n" + tok.decode(r.tokens, skip_special=True).strip()
        c = check_section(Section(item.title, payload), text)
        sections.append({"title": item.title, "markdown": text, "facts_ok": c.facts_ok, "facts_total": c.facts_total,
                         "problems": c.problems, **summary(ctx, r)})
        ctx.report(section=i + 1, sections=n, title=item.title)
    figures = None
    if s.summary:
        masked, answers, text_in = report_template(tok, data, cfg.mask_id)
        r = ctx.turn(session, masked, decode_params(s.infill_params), text=text_in, infill=True)
        fill = iter(r.tokens)
        filled = [next(fill) if x == cfg.mask_id else x for x in masked]
        body = tok.decode(filled, skip_special=True).split("fill: ", 1)[-1].strip()
        figures = {"markdown": body, "exact": filled == answers, **summary(ctx, r)}
        ctx.report(section=n, sections=n, title="Key figures")
    md = [f"# {s.title}", f"*{data.tenant}, {data.period}*", *(x["markdown"] for x in sections)]
    if figures is not None:
        md += ["## Key figures", figures["markdown"]]
    markdown = "\n\n".join(md) + "\n"
    return {"session": session, "title": s.title, "markdown": markdown, "html": to_html(markdown),
            "sections": sections, "figures": figures, "worker": ctx.worker}


def to_html(markdown: str) -> str:
    """The report's Markdown as a standalone HTML page (headings, emphasis lines, paragraphs:
    all the report's Markdown uses); every text escaped."""
    body = []
    for block in markdown.strip().split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("## "):
                body.append(f"<h2>{html.escape(line[3:])}</h2>")
            elif line.startswith("# "):
                body.append(f"<h1>{html.escape(line[2:])}</h1>")
            elif line.startswith("*") and line.endswith("*") and len(line) > 2:
                body.append(f"<p><em>{html.escape(line[1:-1])}</em></p>")
            elif line.strip():
                body.append(f"<p>{html.escape(line)}</p>")
    title = markdown.split("\n", 1)[0].removeprefix("# ")
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title></head>\n"
            f"<body>\n{chr(10).join(body)}\n</body></html>\n")
