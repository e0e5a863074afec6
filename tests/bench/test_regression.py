"""bench/regression.py and its fixed set: every question the README, the docs and the demo show is in it,
each with the number its data fixes; the JSON contract on a tiny run of the shipped model."""

import json
import re
from pathlib import Path

import pytest

from app import demo
from app.cli import _bench_main

ROOT = Path(__file__).resolve().parents[2]
SET = json.loads((ROOT / "bench" / "regression.json").read_text())["questions"]


def test_every_question_the_readme_the_docs_and_the_demo_show_is_in_the_set() -> None:
    texts = [(ROOT / "README.md").read_text(), *(p.read_text() for p in (ROOT / "docs").glob("*.md"))]
    shown = {q for t in texts for q in re.findall(r'"question": ?"([^"]+)"', t) if q != "..."} | set(demo.QUESTIONS)
    assert shown and shown <= {e["question"] for e in SET}
    assert "What was the churn in APAC in 2026-Q3?" in {e["question"] for e in SET if e["mode"] == "client"}


def test_each_question_has_the_number_its_data_fixes_or_is_one_to_refuse() -> None:
    expected = _bench_main("regression").__globals__["expected"]
    for e in SET:
        want = expected(e)
        assert (want is None) == (e.get("expect") == "refused"), e
        assert e["mode"] in ("sample", "client", "dataset") and ("rows" in e or e["mode"] != "dataset"), e
    assert expected({"question": "?", "mode": "dataset", "op": "pct", "calls": [["m", "r", "p1"], ["m", "r", "p2"]],
                     "rows": [["m", "r", "p1", "80"], ["m", "r", "p2", "100"]]}) == "25"
    assert len({(e["question"], e["mode"], e.get("declares", True)) for e in SET}) == len(SET)


def test_a_tiny_run_reports_its_outcomes(capsys: pytest.CaptureFixture[str]) -> None:
    result = _bench_main("regression")(["--only", "What is 40 + 2?"], prog="regression")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)), "the last line is the JSON result"
    assert result["bench"] == "regression" and result["n"] == 1 and result["wrong_successes"] == 0
    assert sum(result["outcomes"].values()) == 1 and len(result["failures"]) == 1 - result["right"]
