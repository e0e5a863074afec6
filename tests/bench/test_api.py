"""bench/api.py: the JSON contract on a quick run (the embedded Redis or REDIS_URL, real workers)."""

import json

import pytest

from app.cli import _bench_main

pytestmark = pytest.mark.slow


def test_a_quick_run_compares_http_with_direct_and_checks_every_result(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)  # the embedded server: what a fresh machine has
    result = _bench_main("api")(["--quick"], prog="api")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)) and result["bench"] == "api"
    assert result["overhead_jobs"] == 8 and result["jobs"] == 12 and result["failed"] == 0
    assert result["http_p50_ms"] > 0 and result["direct_p50_ms"] > 0 and result["jobs_per_s"] > 0
    assert result["correct"] >= 10  # the facts read back (the model is ~96% exact on narratives)


def test_bad_arguments_exit_with_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        _bench_main("api")(["--jobs", "0"], prog="api")
    assert e.value.code == 2
