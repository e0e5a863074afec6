"""bench/documents.py: later report sections in one session are correct with document
boundaries (the shipped rule), on a quick run; the JSON contract."""

import json

import pytest

from app.cli import _bench_main


def test_a_quick_run_keeps_later_sections_correct_with_document_boundaries(
        capsys: pytest.CaptureFixture[str]) -> None:
    result = _bench_main("documents")(["--quick"], prog="documents")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)) and result["bench"] == "documents"
    on, off = result["documents"], result["no_documents"]
    assert on["later_n"] == off["later_n"] == 12
    # with boundaries a later section reads only its own document: as correct as a first one.  The
    # slot model's first-decode rate at the report setting (prefix, W = 8, tau = 0.99) is about
    # 0.73 (30 sessions: first 22/30, later 43/60; quick: 5/6 and 10/12), so the bar is relative
    # (within sampling noise of the first sections), with a floor far above the rule switched off
    assert on["later_correct"] >= on["first_correct"] - 0.1 and on["later_correct"] >= 0.6
    assert on["first_correct"] == off["first_correct"]  # the first sections are the same run either way
    assert off["later_correct"] < on["later_correct"]  # what the rule is for


def test_bad_arguments_exit_with_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        _bench_main("documents")(["--sessions", "0"], prog="documents")
    assert e.value.code == 2
