"""`setflow tour`: the shipped model at work, AR and set decoding side by side, every output
checked and its verdict printed."""

from pathlib import Path

import pytest

from app.cli import main


def test_the_tour_shows_ar_and_set_decoding_side_by_side_with_verdicts(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SETFLOW_DATA_DIR", str(tmp_path))  # the embedded default, in a temporary folder
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(["tour"]) == 0
    out = capsys.readouterr().out
    assert "AR     (W=1):" in out and "set    (W=4, tau=0.9):" in out and "prefix (W=8, tau=0.99):" in out
    assert "tool calls run by the runtime" in out and "hole tokens in" in out
    verdicts = out.count(": correct") + out.count("is correct") + out.count("NOT correct")
    assert verdicts == 6, out
    assert "turn 2 on a fresh engine: restore" in out and "token for token: correct" in out
