"""bench/agent.py: the JSON contract on a tiny run (two real workers; one session per path, on a
history of one earlier conversation; no timing is asserted)."""

import json

import pytest

from app.cli import _bench_main

pytestmark = pytest.mark.slow  # starts two worker processes


def test_a_tiny_run_reports_every_path_verified_and_identical(capsys: pytest.CaptureFixture[str]) -> None:
    result = _bench_main("agent")(["--sessions", "1", "--earlier", "1", "--delay", "0.1"], prog="agent")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)) and result["bench"] == "agent"
    assert result["delay_s"] == 0.1 and result["workers"] == 2
    assert result["redis_used_memory_after"] > 0 and result["kv_bytes_per_session_p50"] > 0
    assert [(r["path"], r["earlier"]) for r in result["rows"]] == [("warm", 1), ("restore", 1), ("recompute", 1)]
    for r in result["rows"]:
        assert r["n"] >= 1 and r["n"] == r["resumes"], r
        assert r["paths_verified"] is True and r["mismatched"] == [], r
        assert r["identical"] is True, r
        assert r["p50_ms"] > 0 and r["p90_ms"] >= r["p50_ms"] and r["full_prefill_p50_ms"] > 0
        assert r["ratio"] == pytest.approx(r["full_prefill_p50_ms"] / r["p50_ms"], rel=0.01)
        assert r["history_tokens_p50"] > 100  # the earlier conversation is in the state a resume finds
    # the restored and recomputed resumes ran on the worker that did not hold the session
    assert result["rows"][1]["workers_used"] == result["rows"][2]["workers_used"] == ["w1", "w2"]


@pytest.mark.parametrize("args", [["--sessions", "0"], ["--earlier", "9"], ["--earlier", "x"], ["--delay", "-1"]])
def test_bad_arguments_exit_with_a_usage_error(args: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _bench_main("agent")(args, prog="agent")
    assert e.value.code == 2
