"""domain/charts.py: the spec is Vega-Lite (validated against the JSON schema altair ships, the
version vl-convert renders), its data inline and exact, names only ever data; rendered by
vl-convert, a name in any script is text in the SVG."""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path
from typing import Any

import altair
import jsonschema
import pytest
import vl_convert

from domain import charts
from domain.draws import make_payload, wild_payload
from domain.payload import Breakdown, Metric, Payload

SCHEMA = Path(altair.__file__).parent / "vegalite" / "v6" / "schema" / "vega-lite-schema.json"
PAYLOAD = Payload("Northwind", "2026-Q3", "formal",
                  [Metric("revenue", "1240", "1105", "1300"), Metric("churn", "2.4", "2.6"),
                   Metric("営業利益", "-120", "80", "100", custom_unit="百万円")],
                  Breakdown("region", "revenue", [("EMEA", "512", "468"), ("東京", "301", "318"),
                                                  ("الشرق الأوسط", "427", "319")]))


@cache
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA.read_text())
    return jsonschema.Draft7Validator(schema)


def problems(spec: dict[str, Any]) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator().iter_errors(spec)]


def test_the_schema_is_the_one_vl_convert_renders() -> None:
    assert json.loads(SCHEMA.read_text())["$ref"] == "#/definitions/TopLevelSpec"
    assert altair.SCHEMA_VERSION.startswith("v6.") and "6.4" in vl_convert.get_vegalite_versions()
    assert charts.SCHEMA.endswith("/vega-lite/v6.json")


@pytest.mark.parametrize("seed", range(6))
def test_specs_validate_against_the_vega_lite_schema(seed: int) -> None:
    rng = random.Random(seed)
    for p in (PAYLOAD, make_payload(rng), wild_payload(rng), wild_payload(rng)):
        spec = charts.chart(p, "A title")
        assert problems(spec) == [], p
        assert len(spec["vconcat"]) == 1 + (p.breakdown is not None)


def test_a_broken_spec_is_refused() -> None:
    """The schema check itself bites."""
    spec = charts.chart(PAYLOAD, "t")
    spec["vconcat"][1]["mark"] = "barr"
    assert problems(spec)


def test_the_data_is_inline_exact_and_in_the_payloads_order() -> None:
    spec = charts.chart(PAYLOAD, "Northwind, 2026-Q3")
    metrics, rows = spec["vconcat"][0]["data"]["values"], spec["vconcat"][1]["data"]["values"]
    assert [(v["metric"], v["measure"], v["amount"]) for v in metrics] == [
        ("Revenue (k USD)", "prev", 1105.0), ("Revenue (k USD)", "value", 1240.0), ("Revenue (k USD)", "target", 1300.0),
        ("Churn (%)", "prev", 2.6), ("Churn (%)", "value", 2.4),
        ("営業利益 (百万円)", "prev", 80.0), ("営業利益 (百万円)", "value", -120.0), ("営業利益 (百万円)", "target", 100.0)]
    assert [(v["row"], v["measure"], v["amount"]) for v in rows] == [
        ("EMEA", "value", 512.0), ("EMEA", "prev", 468.0), ("東京", "value", 301.0), ("東京", "prev", 318.0),
        ("الشرق الأوسط", "value", 427.0), ("الشرق الأوسط", "prev", 319.0)]
    # names are data only: nowhere else in the spec (no field name, no expression holds one)
    text = json.dumps({k: v for k, v in spec.items()} | {"vconcat": [{k: v for k, v in part.items() if k != "data"}
                                                                    for part in spec["vconcat"]]}, ensure_ascii=False)
    for name in ("営業利益", "東京", "الشرق الأوسط", "EMEA"):
        assert name not in text
    assert "url" not in json.dumps(spec)  # nothing to fetch


def test_the_svg_holds_names_in_any_script() -> None:
    svg = vl_convert.vegalite_to_svg(charts.chart(PAYLOAD, "Überblick: 北区"), vl_version="6.4", allowed_base_urls=[])
    assert svg.lstrip().startswith("<svg")
    for text in ("Überblick: 北区", "営業利益 (百万円)", "東京", "الشرق الأوسط", "Revenue by region (k USD)", "EMEA"):
        assert text in svg, text
    assert "href" not in svg and "<image" not in svg  # drawn as marks and text, nothing linked


def test_a_narrative_without_breakdown_or_targets() -> None:
    p = Payload("Acme", "FY26", "brief", [Metric("latency", "182", "190")])
    spec = charts.chart(p, "Acme, FY26")
    assert problems(spec) == [] and len(spec["vconcat"]) == 1
    assert {v["measure"] for v in spec["vconcat"][0]["data"]["values"]} == {"value", "prev"}
    assert "P95 latency (ms)" in vl_convert.vegalite_to_svg(spec, vl_version="6.4", allowed_base_urls=[])
