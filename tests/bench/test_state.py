"""bench/state.py: the JSON contract on a small run, and what it measured on a fresh Redis: no
orphan, exact accounts, memory within the budgets, on one server and on a local Redis Cluster
(no timing assertions)."""

import json

import pytest

from app.cli import _bench_main


def test_a_small_run_reports_memory_orphans_and_latency(capsys: pytest.CaptureFixture[str]) -> None:
    main = _bench_main("state")
    result = main(["--ops", "300", "--sessions", "20,40", "--samples", "10"], prog="state")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)), "the last line is the JSON result"
    assert {"max_used_memory_over_budget", "orphan_bytes", "delete_ms_ratio", "commit_ms_ratio", "cluster"} <= set(result)
    assert result["orphan_bytes"] == 0 and result["accounts_exact"] is True
    assert result["churn"]["now"]["by_op"]["crash"] > 0, "the churn killed some writers"
    assert result["max_used_memory_over_budget"] <= 1.10
    assert [r["sessions"] for r in result["latency"]] == [20, 40]
    cluster = result["cluster"]  # the same on a local Redis Cluster of 3 masters
    assert cluster["masters"] == 3 and cluster["orphan_bytes"] == 0 and cluster["accounts_exact"] is True
    assert cluster["max_used_memory_over_budget"] <= 1.10 and cluster["churn"]["by_op"]["fork"] > 0


def test_bad_arguments_exit_with_a_usage_error() -> None:
    main = _bench_main("state")
    for argv in (["--ops", "0"], ["--sessions", "x"], ["--sessions", "100"], ["--sessions", "5,100"]):
        with pytest.raises(SystemExit) as e:
            main(argv, prog="state")
        assert e.value.code == 2
