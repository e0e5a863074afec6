"""bench/exports.py: the JSON contract on a quick run (no timing is asserted)."""

import json

import pytest

from app.cli import _bench_main


def test_a_quick_run_reports_html_and_pdf_per_section(capsys: pytest.CaptureFixture[str]) -> None:
    result = _bench_main("exports")(["--quick", "--sections", "1", "2"], prog="exports")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)) and result["bench"] == "exports"
    assert [(r["sections"], r["detail"]) for r in result["rows"]] == [(1, "standard"), (1, "full"), (2, "standard"),
                                                                      (2, "full")]
    for r in result["rows"]:
        assert r["html_s"] > 0 and r["pdf_s"] > 0 and r["pdf_bytes"] > 1000 and r["html_bytes"] > 1000
        assert r["html_per_section_s"] == pytest.approx(r["html_s"] / r["sections"], abs=0.002)
    assert result["first_html_s"] > 0 and result["first_pdf_s"] > 0


@pytest.mark.parametrize("args", [["--sections", "7"], ["--repeats", "0"], ["--sections", "x"]])
def test_bad_arguments_exit_with_a_usage_error(args: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _bench_main("exports")(args, prog="exports")
    assert e.value.code == 2
