"""The `report` job kind: a section per outline item, each a turn of one session (the earlier
sections stay in its cache; each is a document of its own, model/masks.py), then the key-figures
template filled by infill in the same session; the report as Markdown and HTML."""

from __future__ import annotations

import html
from typing import Any

from model.corpus import narrative as corpus
from model.corpus.report import Section, check_section
from model.params import DecodeParams
from runtime.jobs.plans import check_fits, report_template, section_input, section_payload
from runtime.jobs.specs import ReportSpec
from workflows.turn import Turns, decode_params, fill, summary


def run(turns: Turns, spec: ReportSpec) -> dict[str, Any]:
    """The whole plan is checked against the model's context before the first section.
    Progress after each section: {"section": sections done, "sections": n, "title": the last
    one done}."""
    # the session without this job's own turns (a rerun has written some already): the plan counts them
    check_fits("report", spec, turns.tokenizer, turns.used(), turns.cfg.max_seq_len)
    data = spec.data.to_payload()
    n = len(spec.outline) + int(spec.summary)
    turns.report(section=0, sections=n, title=None)
    sections: list[dict[str, Any]] = []
    session = ""
    for i, item in enumerate(spec.outline):
        done, session = section(turns, item.title, section_payload(data, list(item.metrics)),
                                decode_params(spec.params))
        sections.append(done)
        turns.report(section=i + 1, sections=n, title=item.title)
    figs = None
    if spec.summary:
        figs = figures(turns, data, decode_params(spec.infill_params))
        turns.report(section=n, sections=n, title="Key figures")
    md = [f"# {spec.title}", f"*{data.tenant}, {data.period}*", *(x["markdown"] for x in sections)]
    if figs is not None:
        md += ["## Key figures", figs["markdown"]]
    markdown = "\n\n".join(md) + "\n"
    return {"session": session, "title": spec.title, "markdown": markdown, "html": to_html(markdown),
            "sections": sections, "figures": figs}


def section(turns: Turns, title: str, payload: corpus.Payload, params: DecodeParams
            ) -> tuple[dict[str, Any], str]:
    """One section as a turn: its input ends with the heading, the model writes the body; the
    facts read back out of it.  Returns the section's result and the session's id."""
    ids, text_in = section_input(turns.tokenizer, title, payload)
    r = turns.turn(ids, params, text=text_in)
    text = f"## {title}\n" + turns.tokenizer.decode(r.tokens, skip_special=True).strip()
    c = check_section(Section(title, payload), text)
    return {"title": title, "markdown": text, "facts_ok": c.facts_ok, "facts_total": c.facts_total,
            "problems": c.problems, **summary(r)}, r.session


def figures(turns: Turns, data: corpus.Payload, params: DecodeParams) -> dict[str, Any]:
    """The key-figures template of `data` (its breakdown left out) filled by infill; exact: every
    hole holds the answer the data fixes."""
    masked, answers, text_in = report_template(turns.tokenizer, data, turns.cfg.mask_id)
    filled, r = fill(turns, masked, params, text=text_in)
    body = turns.tokenizer.decode(filled, skip_special=True).split("fill: ", 1)[-1].strip()
    return {"markdown": body, "exact": filled == answers, **summary(r)}


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
