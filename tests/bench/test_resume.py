"""bench/resume.py: the JSON contract on a quick run (against the embedded Redis or REDIS_URL)."""

import json

import pytest

from app.cli import _bench_main


def test_a_quick_run_reports_every_path_and_the_commit_overhead(capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)  # the embedded server: what a fresh machine has
    result = _bench_main("resume")(["--quick"], prog="resume")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)) and result["bench"] == "resume"
    assert [r["history_tokens"] for r in result["rows"]] == [256, 1024]
    for r in result["rows"]:
        assert {"warm_ms", "restore_ms", "recompute_ms", "chosen", "chosen_ms", "kv_bytes",
                "restore_fraction_of_raw"} <= set(r)
        assert r["chosen"] in ("restore", "recompute") and r["kv_bytes"] > 0
        assert r["kv_bytes_per_token"] >= 2 * 4 * 2 * 32 * 4  # K and V, 4 layers, 2 heads of 32, fp32
        assert r["pool_row_bytes"] >= r["kv_bytes"] and r["pool_row_over_held"] >= 1  # a static row holds the context
    assert result["commit_overhead"]["decode_ms_per_step_with_writes_behind"] > 0


def test_bad_arguments_exit_with_a_usage_error() -> None:
    for bad in (["--repeats", "0"], ["--presets", "qwen3-70b"], ["--dtype", "fp8"]):
        with pytest.raises(SystemExit) as e:
            _bench_main("resume")(bad, prog="resume")
        assert e.value.code == 2


def test_the_realistic_shapes_are_the_released_ones() -> None:
    """Qwen3-0.6B and -1.7B: 28 layers, 8 KV heads of 128: 112 KiB of K/V per token in bf16."""
    import torch

    from bench.resume import REALISTIC, pool_row_bytes
    for cfg in REALISTIC.values():
        assert (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size) == (28, 8, 128, 151936)
        assert pool_row_bytes(cfg, torch.bfloat16) == 112 * 1024 * cfg.max_seq_len
