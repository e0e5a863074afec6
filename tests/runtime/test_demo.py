"""`setflow demo`: the shipped model at work, AR and set decoding side by side, every output
checked and its verdict printed."""

import pytest

from runtime.cli import main


def test_the_demo_shows_ar_and_set_decoding_side_by_side_with_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "AR     (W=1):" in out and "set    (W=4, tau=0.9):" in out and "prefix (W=8, tau=0.99):" in out
    assert "tool calls run by the runtime" in out and "hole tokens in" in out
    verdicts = out.count(": correct") + out.count("is correct") + out.count("NOT correct")
    assert verdicts == 5, out
