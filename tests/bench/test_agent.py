"""bench/agent.py: the JSON contract on a tiny run (two real workers; one session per path, on a
history of one earlier conversation; no timing is asserted); a job without an answer is counted,
never a crash."""

import json

import pytest

from app.cli import _bench_main
from bench import agent as bench
from runtime.tables import JobRecord

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


def test_a_job_without_an_answer_counts_in_its_row_as_not_identical_never_as_a_crash() -> None:
    """A job that fails no_answer is a question the model did not answer, not the bench's error:
    its session is reported (not identical, counted in `no_answer`), its resumes timed as any."""
    assert bench.no_answer(JobRecord(status="failed", error={"code": "no_answer", "message": "no answer"}))
    assert not bench.no_answer(JobRecord(status="failed", error={"code": "time_limit", "message": "late"}))
    assert not bench.no_answer(JobRecord(status="succeeded", error=None))
    resume = {"ok": True, "ms": 2.0, "baseline_ms": 4.0, "dispatch_ms": 1.0, "baseline_dispatch_ms": 1.0,
              "replay_ms": 0.5, "history_tokens": 120, "step": 1, "actual": "warm", "from": "w1", "to": "w1"}
    answered = {"session": "a", "path": "warm", "earlier": 0, "resumes": [resume], "load_ms": 0.1,
                "identical": True, "no_answer": False}
    unanswered = {**answered, "session": "b", "identical": False, "no_answer": True}
    [row, *_] = bench.summarise([answered, unanswered], [0])
    assert (row["path"], row["sessions"], row["n"], row["no_answer"]) == ("warm", 2, 2, 1)
    assert row["identical"] is False and row["paths_verified"] is True
