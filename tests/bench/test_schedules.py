"""bench/schedules.py: the JSON contract on a quick run (the embedded Redis or REDIS_URL, a SQLite
file, no worker); no timing assertions."""

import json

import pytest

from app.cli import _bench_main

pytestmark = pytest.mark.slow


def test_a_quick_run_submits_every_tick_once(capsys: pytest.CaptureFixture[str]) -> None:
    result = _bench_main("schedules")(["--quick"], prog="schedules")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)) and result["bench"] == "schedules"
    assert (result["schedules"], result["minutes"], result["tickers"], result["sql"]) == (40, 2, 3, "sqlite")
    assert result["ticks"] == 80 and (result["duplicates"], result["missed"]) == (0, 0)
    assert result["late_p50_s"] is not None and result["late_p99_s"] >= result["late_p50_s"] >= 0
    assert [m["ticks"] for m in result["per_minute"]] == [40, 40] and "bench/exports.py" in result["render"]


def test_bad_arguments_exit_with_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        _bench_main("schedules")(["--schedules", "0"], prog="schedules")
    assert e.value.code == 2
