"""Charts: a payload's facts as a Vega-Lite spec (plain JSON; the exports render it to SVG,
runtime/api/exports.py).  Knows nothing of rendering, fonts or files.

    title: the narrative's tenant and period, or the report section's title
    one row per metric, its own x scale (metrics have units of their own):
        Revenue (k USD)   [=========== value ======]   prev: a wide pale bar, target: a tick
    the breakdown, if any: a bar per row, value and prev side by side

The data is inline (no URL is ever fetched); names go in as data, never as field names or
expressions, so any text in any script is safe in them.  Numbers are JSON numbers (a double
holds the grammar's 15 significant digits exactly)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from domain.payload import Payload

SCHEMA = "https://vega.github.io/schema/vega-lite/v6.json"  # the spec's version: the renderer picks its library by it
WIDTH = 420  # px of a chart's plot
#: the three measures and their colours: the value stands out, prev is its pale backdrop, the target a dark tick
MEASURES = ("value", "prev", "target")
COLORS = ("#3a7bd5", "#c9d3df", "#1d232b")


def _number(x: str) -> float:
    return float(Decimal(x))


def _colour(p: Payload) -> dict[str, Any]:
    """The measures' colours, the same in every part of a chart; the target's only where p has one."""
    n = 3 if any(m.target is not None for m in p.metrics) else 2
    return {"field": "measure", "type": "nominal", "title": None,
            "scale": {"domain": list(MEASURES[:n]), "range": list(COLORS[:n])}, "legend": {"orient": "bottom"}}


def metrics_chart(p: Payload) -> dict[str, Any]:
    """A bullet per metric: value as a bar over prev's pale bar, the target as a tick; each metric
    a row of its own with its own x scale, named by its display name and unit."""
    rows = []
    for i, m in enumerate(p.metrics):
        label = f"{m.display} ({m.unit})"
        rows += [{"order": i, "metric": label, "measure": "prev", "amount": _number(m.prev)},
                 {"order": i, "metric": label, "measure": "value", "amount": _number(m.value)}]
        if m.target is not None:
            rows.append({"order": i, "metric": label, "measure": "target", "amount": _number(m.target)})
    x = {"field": "amount", "type": "quantitative", "title": None}
    layer = [
        {"transform": [{"filter": {"field": "measure", "equal": "prev"}}],
         "mark": {"type": "bar", "height": 18}, "encoding": {"x": x, "color": _colour(p)}},
        {"transform": [{"filter": {"field": "measure", "equal": "value"}}],
         "mark": {"type": "bar", "height": 8}, "encoding": {"x": x, "color": _colour(p)}},
        {"transform": [{"filter": {"field": "measure", "equal": "target"}}],
         "mark": {"type": "tick", "thickness": 3, "size": 24}, "encoding": {"x": x, "color": _colour(p)}},
    ]
    return {"data": {"values": rows},
            "facet": {"row": {"field": "metric", "type": "nominal", "title": None, "sort": {"field": "order", "op": "min"},
                              "header": {"labelAngle": 0, "labelAlign": "left", "labelAnchor": "start",
                                         "labelOrient": "top", "labelFontWeight": "bold", "labelLimit": 0}}},
            "spec": {"width": WIDTH, "height": 24, "layer": layer},
            "resolve": {"scale": {"x": "independent"}}}


def breakdown_chart(p: Payload) -> dict[str, Any] | None:
    """The breakdown's rows as bars, value and prev side by side, in the payload's order; None
    without a breakdown."""
    b = p.breakdown
    if b is None:
        return None
    m = next(m for m in p.metrics if m.key == b.metric)
    values = [{"order": i, "row": name, "measure": measure, "amount": _number(x)}
              for i, (name, v, pv) in enumerate(b.rows) for measure, x in (("value", v), ("prev", pv))]
    return {"data": {"values": values}, "title": {"text": f"{m.display} by {b.kind} ({m.unit})", "anchor": "start",
                                                  "fontSize": 12},
            "width": WIDTH, "height": {"step": 14},
            "mark": "bar",
            "encoding": {"y": {"field": "row", "type": "nominal", "title": None, "sort": {"field": "order", "op": "min"},
                               "axis": {"labelLimit": 0}},
                         "yOffset": {"field": "measure", "sort": ["value", "prev"]},
                         "x": {"field": "amount", "type": "quantitative", "title": None},
                         "color": _colour(p)}}


def chart(p: Payload, title: str) -> dict[str, Any]:
    """The Vega-Lite spec of p's facts, titled `title`: its metrics, then its breakdown."""
    parts = [metrics_chart(p)]
    b = breakdown_chart(p)
    if b is not None:
        parts.append(b)
    return {"$schema": SCHEMA, "title": {"text": title, "anchor": "start"}, "vconcat": parts,
            "config": {"font": "DejaVu Sans, Noto Sans, Noto Sans CJK JP, sans-serif", "view": {"stroke": None}}}
