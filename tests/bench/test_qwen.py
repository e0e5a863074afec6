"""bench/qwen.py: its arguments and its bound (a run needs a Qwen3-sized checkpoint: minutes, not
the suite's; no timing assertions)."""

import pytest

from app.cli import _bench_main


def test_bad_arguments_exit_with_a_usage_error() -> None:
    main = _bench_main("qwen")
    for argv in (["--dtypes", "fp16"], ["--threads", "0"], ["--threads", "x"], ["--repeats", "0"], ["--shape", "tiny"],
                 ["--clock", "cpu", "--threads", "1,2"], ["--clock", "gpu"]):
        with pytest.raises(SystemExit) as e:
            main(argv, prog="qwen")
        assert e.value.code == 2


def test_a_row_meets_a_ratio_target_from_above_and_the_bound_from_below() -> None:
    summary = _bench_main("qwen").__globals__["summary"]
    rows = [{"dtype": "fp32", "threads": 1, "case": c, "tokens_per_s": t, "of_bound": b}
            for c, t, b in (("prefill", 2.0, 1.2), ("prefill_hf", 1.0, 1.0), ("ar", 1.0, 1.4), ("ar_hf", 2.0, 1.0),
                            ("W4", 5.0, 1.3), ("W8", 6.0, 1.6), ("batch1", 1.0, 1.1), ("batch8", 3.0, 1.2))]
    got = summary(rows)["fp32_t1"]
    assert got["prefill"] == {"got": 2.0, "target": 1.0, "met": True}
    assert got["ar"]["got"] == 0.5 and not got["ar"]["met"]
    assert got["W4"]["got"] == 2.5 and got["W4"]["met"] and got["W8"]["got"] == 3.0 and got["W8"]["met"]
    assert got["batch8"] == {"got": 3.0, "target": 3.0, "met": True}
    assert got["of_bound"] == {"got": 1.6, "target": 1.5, "met": False}  # the worst of setflow's rows


def test_the_decode_rows_time_decode_only_on_both_sides() -> None:
    """setflow_decode and hf_decode each prefill their prompt untimed and return the decode's
    own new tokens and forwards: AR one forward a token on both sides, W = 4 with every position
    committed a quarter of them (the tiny shape: seconds)."""
    import torch

    q = _bench_main("qwen").__globals__
    from model import checkpoint
    from model.params import DecodeParams

    model = checkpoint.load(q["imported"]("tiny"), dtype=torch.float32)
    ids = [i % model.cfg.vocab_size for i in q["prompt_ids"](24, 1)]
    _, tokens, forwards = q["setflow_decode"](model, ids, DecodeParams(policy="ar", max_new_tokens=8, ignore_eos=True))
    assert (tokens, forwards) == (8, 8)
    _, tokens, forwards = q["setflow_decode"](model, ids, DecodeParams(policy="set", window=4, tau=0.0,
                                                                       max_new_tokens=8, ignore_eos=True))
    assert (tokens, forwards) == (8, 2)
    _, tokens, forwards = q["hf_decode"](q["hf_model"](model), ids, 8)
    assert (tokens, forwards) == (8, 8)
