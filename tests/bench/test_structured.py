"""bench/structured.py and bench/grammars.py: the JSON contract on tiny runs of the shipped model
and of the grammar engines; no closed document is ever invalid."""

import json

import pytest

from app.cli import _bench_main


def test_a_tiny_run_reports_validity_and_the_grammars_cost(capsys: pytest.CaptureFixture[str]) -> None:
    result = _bench_main("structured")(["--quick", "--only", "enum", "--batch", "2"], prog="structured")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)), "the last line is the JSON result"
    rows = result["rows"]
    assert [(r["policy"], r["batch"]) for r in rows] == [("prefix", 1), ("prefix", 2), ("set", 1), ("set", 2)]
    assert all(r["valid"] == 1.0 and r["invalid"] == 0 and r["masks"] > 0 for r in rows), rows
    assert result["summary"]["invalid"] == 0 and result["summary"]["over_unguided_step_b1"] >= 1.0


def test_both_engines_accept_every_example_document(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("xgrammar")  # measured beside llguidance, not a dependency
    result = _bench_main("grammars")(["--repeat", "1"], prog="grammars")
    assert [r["engine"] for r in result["rows"]] == ["llguidance", "xgrammar"]
    assert all(r["masks"] > 0 and r["warm_mask_us_p50"] > 0 for r in result["rows"])
