"""bench/responses.py: the JSON contract on a quick run (the embedded Redis, one real worker, the
openai SDK over HTTP); no timing is asserted."""

import json

import pytest

from app.cli import _bench_main

pytestmark = pytest.mark.slow  # starts a worker process and the API


def test_a_quick_run_goes_on_from_state_and_the_stateless_client_reads_it_all_again(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)  # the embedded server: what a fresh machine has
    result = _bench_main("responses")(["--quick"], prog="responses")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)) and result["bench"] == "responses"
    n, ways = result["turns"], ("sdk", "native", "stateless")
    assert n == 5 and result["repeats"] == 2 and result["responses"] == 3 * n * 2
    for key in ("ms_p50", "prefill", "cached", "rows", "growth", "growth_vs_turn2", "worker_growth", "prefill_growth"):
        assert set(result[key]) == set(ways), key
    assert {"sdk_over_native_p50", "sdk_added_ms_p50", "targets", "targets_met", "redis_used_memory_before",
            "redis_used_memory_after", "worker_rss_mb", "worker_peak_rss_mb", "wall_s"} <= set(result)
    assert set(result["targets"]) >= {"sdk_growth", "native_growth", "route_overhead"}
    assert result["targets_met"] == all(result["targets"][k] for k in ("sdk_growth", "native_growth", "route_overhead"))
    # every response ended with text, every native turn succeeded
    assert set(result["statuses"]["sdk"]) | set(result["statuses"]["stateless"]) <= {"completed", "incomplete"}
    assert result["statuses"]["native"] == ["succeeded"]
    assert all(ms > 0 for w in ways for ms in result["ms_p50"][w].values())
    # every answer decoded to its limit (ignore_eos): the same decode on every turn, every way
    assert result["eos"] is False and result["max_output_tokens"] == 16
    assert all(r["output_tokens"] == 16 for w in ways for r in result["rows"][w])
    # with state: each turn reads its new message only (~constant), on top of what the session holds
    for w in ("sdk", "native"):
        prefill = [result["prefill"][w][str(k)] for k in range(1, n + 1)]
        cached = [result["cached"][w][str(k)] for k in range(1, n + 1)]
        assert 0 < max(prefill) <= 2 * min(prefill), (w, prefill)
        assert cached[0] == 0 and all(a < b for a, b in zip(cached, cached[1:])), (w, cached)
    assert result["prefill"]["sdk"] == result["prefill"]["native"]  # the same messages, the same turn input
    # stateless: a new session each time, prefilling the whole history
    prefill = [result["prefill"]["stateless"][str(k)] for k in range(1, n + 1)]
    assert prefill[0] == result["prefill"]["sdk"]["1"] and all(a < b for a, b in zip(prefill, prefill[1:]))
    assert prefill[-1] > result["cached"]["sdk"][str(n)] - 20  # about all the stateful session holds
    assert all(v == 0 for v in result["cached"]["stateless"].values())
    assert result["prefill_growth"]["stateless"] > 3 > result["prefill_growth"]["sdk"]
    # one worker: every stateful turn after the first found its session warm
    assert result["unexpected_paths"] == []
    assert result["redis_used_memory_after"] > result["redis_used_memory_before"] > 0 and result["worker_rss_mb"] > 0
    kv = result["kv_bytes_per_conversation"]
    assert set(kv) == set(ways) and kv["stateless"] > kv["sdk"] > 0  # a kept session per request


def test_bad_arguments_exit_with_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        _bench_main("responses")(["--turns", "0"], prog="responses")
    assert e.value.code == 2


def test_a_tool_chain_over_a_socket_and_over_http_says_the_same(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    result = _bench_main("responses")(["--tools", "--calls", "2", "--repeats", "1"], prog="responses")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)) and result["mode"] == "tools"
    assert result["calls"] == 2 and result["responses_per_chain"] == 3 and result["same_output"] is True
    assert set(result["chain_ms_p50"]) == {"socket", "http"} and all(v > 0 for v in result["chain_ms_p50"].values())
    assert result["socket_over_http_p50"] > 0
