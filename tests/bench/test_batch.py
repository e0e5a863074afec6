"""bench/batch.py: the JSON contract on a quick run with short turns (no timing assertions)."""

import json

import pytest

from app.cli import _bench_main


def test_a_quick_run_reports_every_dtype_task_and_session_count(capsys: pytest.CaptureFixture[str]) -> None:
    main = _bench_main("batch")
    sessions = [1, 8]  # quick's 1, 8, 16 cost the suite a minute; 8 batches and has a target
    result = main(["--quick", "--tokens", "16", "--sessions", ",".join(map(str, sessions))], prog="batch")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)), "the last line is the JSON result"
    assert result["bench"] == "batch"
    per = main.__globals__["TURNS"]
    rows = result["rows"]
    assert [(r["dtype"], r["task"], r["turns_per_session"], r["sessions"]) for r in rows] == \
        [(d, t, k, n) for d in ("fp32", "bf16") for t in ("narrative", "agent") for k in per for n in sessions]
    for r in rows:
        assert {"sessions", "batched_tokens_per_s", "sequential_tokens_per_s", "ratio", "identical", "dtype", "task",
                "ceiling", "sequential_p50_ms", "sequential_p99_ms", "batched_p50_ms", "batched_p99_ms"} <= set(r)
        assert r["ratio"] > 0 and r["ceiling"] > 0 and r["batched_tokens_per_s"] > 0 and r["sequential_tokens_per_s"] > 0
        # the bound is the ceiling at the pass's mean batch: no more than the ceiling (2 decimals each)
        assert 0 < r["bound"] <= max(r["ceiling"], 1.0) + 0.01
        assert r["tokens"] > 0 and 0 <= r["identical_fraction"] <= 1 and 1 <= r["mean_batch"] <= r["sessions"]
        assert r["batched_p50_ms"] <= r["batched_p99_ms"] and r["sequential_p50_ms"] <= r["sequential_p99_ms"]
        if r["dtype"] == "fp32":  # batched decoding writes exactly what each turn writes alone
            assert r["identical"] and r["identical_fraction"] == 1.0
            assert r["batched_turn_nfe_per_token"] == r["sequential_forwards_per_token"]
        if r["task"] == "narrative":  # ignore_eos: every turn writes all its tokens
            assert r["tokens"] == 16 * r["sessions"] * r["turns_per_session"]
        if r["sessions"] == 1:
            assert r["batched_forwards_per_token"] == r["sequential_forwards_per_token"]
        else:  # a batched step counts once
            assert r["batched_forwards_per_token"] < r["sequential_forwards_per_token"]
    assert set(result["targets"]) == {f"{d}/{t}/{k}" for d in ("fp32", "bf16") for t in ("narrative", "agent") for k in per}


def test_bad_arguments_exit_with_a_usage_error() -> None:
    main = _bench_main("batch")
    for argv in (["--sessions", "0"], ["--sessions", "x"], ["--dtypes", "fp16"], ["--tasks", "poetry"],
                 ["--repeats", "0"], ["--threads", "0"], ["--turns", "0"], ["--turns", "x"]):
        with pytest.raises(SystemExit) as e:
            main(argv, prog="batch")
        assert e.value.code == 2
