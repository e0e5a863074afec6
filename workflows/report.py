"""Reports.  `fill` fills one report template by infill over a bare model (benchmarks, the model
tour): the template's text (and its payload) is the context, its holes are masks decoded in
place; positions never shift.  `job` is the `report` job kind: a section per outline item, each
a turn of one session, then the key-figures template filled by infill in the same session; the
report as Markdown and HTML, progress after each section."""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from model.config import BOS_ID
from model.corpus import mixture
from model.corpus.narrative import Payload
from model.corpus.report import HOLE, Section, Template, check_section, template
from model.decode import DecodeParams, begin_infill, decode
from model.kv_cache import KVCache
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.job_context import JobContext
from runtime.schemas import ReportSpec, check_spec
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
    ids, hole = mixture.infill_tokens(tok, template)
    w = next(model.parameters())
    cache = KVCache.for_model(model.cfg, dtype=w.dtype, device=w.device)
    state = begin_infill(model, cache, [model.cfg.mask_id if h else x for x, h in zip(ids, hole)])
    for _ev in decode(model, cache, state, params):
        pass
    return FillResult(state.tokens, ids, hole, state.nfe, time.perf_counter() - t0)


# ---- the report job ---------------------------------------------------------------------------


def section_payload(data: Payload, keys: list[str]) -> Payload:
    """The data one section is written from: its metrics (in outline order), and the breakdown
    when it breaks one of them down (as in training, where a section has at most two metrics)."""
    by_key = {m.key: m for m in data.metrics}
    b = data.breakdown if data.breakdown is not None and data.breakdown.metric in keys else None
    return Payload(data.tenant, data.period, data.style, [by_key[k] for k in keys], b)


def job(ctx: JobContext, spec: dict[str, Any]) -> dict[str, Any]:
    """Each outline item is a section, written as a turn of the job's session (the earlier
    sections stay in its cache); then the key-figures template is filled by infill, a turn too.
    Progress after each section: {"section": i, "sections": n, "title": ...}."""
    s = check_spec("report", spec, ctx.job.session_id)
    assert isinstance(s, ReportSpec)
    session, tok, mask = session_of(ctx), ctx.tokenizer, ctx.engine.model.cfg.mask_id
    data = s.data.to_payload()
    n = len(s.outline) + int(s.summary)
    ctx.report(section=0, sections=n, title=s.outline[0].title)
    sections: list[dict[str, Any]] = []
    for i, item in enumerate(s.outline):
        sec = Section(item.title, section_payload(data, list(item.metrics)))
        r = ctx.turn(session, [BOS_ID, *tok.encode(sec.prompt_text())], decode_params(s.params),
                     text=sec.prompt_text())
        text = tok.decode(r.tokens, skip_special=True).strip()
        c = check_section(sec, text)
        sections.append({"title": item.title, "markdown": text, "facts_ok": c.facts_ok, "facts_total": c.facts_total,
                         "problems": c.problems, **summary(ctx, r)})
        ctx.report(section=i + 1, sections=n, title=item.title)
    figures = None
    if s.summary:
        t = template(replace(data, breakdown=None))
        ids, hole = mixture.infill_tokens(tok, t)
        r = ctx.turn(session, [mask if h else x for x, h in zip(ids, hole)], decode_params(s.infill_params),
                     text=t.context_text() + t.text(hole=HOLE), infill=True)
        fill = iter(r.tokens)
        filled = [next(fill) if h else x for x, h in zip(ids, hole)]
        body = tok.decode(filled, skip_special=True).split("fill: ", 1)[-1].strip()
        figures = {"markdown": body, "exact": filled == ids, **summary(ctx, r)}
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
