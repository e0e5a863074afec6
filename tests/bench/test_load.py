"""bench/load.py: the JSON contract on a tiny run (two real workers, the embedded Redis)."""

import json

import pytest

from app.cli import _bench_main


def test_a_tiny_run_reports_the_contract(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)  # the embedded server: what a fresh machine has
    result = _bench_main("load")(["--sessions", "2", "--turns", "2", "--tokens", "8", "--overhead-sessions", "1"],
                                 prog="load")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result))
    assert {"bench", "turns_per_s", "p50_ms", "p99_ms", "affinity_hit_rate", "overhead_ratio", "lost",
            "duplicated"} <= set(result) and result["bench"] == "load"
    assert result["lost"] == result["duplicated"] == result["mismatched"] == 0
    assert result["paths"]["new"] == 2 and sum(result["paths"].values()) == 4
    assert 0 <= result["affinity_hit_rate"] <= 1 and result["turns_per_s"] > 0


def test_bad_arguments_exit_with_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        _bench_main("load")(["--workers", "0"], prog="load")
    assert e.value.code == 2
