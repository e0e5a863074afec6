"""bench/quality.py: the JSON contract on a tiny run of the shipped model, and the target logic."""

import json
from typing import Any

import pytest

from app.cli import _bench_main


def test_a_tiny_run_reports_every_task_and_setting(capsys: pytest.CaptureFixture[str]) -> None:
    main = _bench_main("quality")
    result = main(["--quick", "--n", "1"], prog="quality")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(result)), "the last line is the JSON result"
    assert result["bench"] == "quality"
    rows = result["rows"]
    tasks = ("narrative", "agent", "section", "infill", "narrative_ood", "section_ood", "agent_ood",
             "narrative_realistic", "section_realistic", "agent_realistic", "agent_phrased", "report_realistic",
             "drivers_ood", "drivers_realistic", "agent_client")
    assert {(r["task"], r["policy"]) for r in rows} == {(t, p) for t in tasks for p in ("ar", "set", "prefix")}
    for r in rows:
        assert {"task", "policy", "W", "tau", "fully_correct", "nfe_per_token", "tokens_per_s"} <= set(r)
        assert 0 <= r["fully_correct"] <= 1 and r["n"] == 1 and r["wrong_successes"] in (0, 1)
        if r["tokens"] == 0:  # a question asked out of the trained phrasings may end with no answer: a failed job
            assert r["task"] == "agent_phrased" and r["fully_correct"] == 0 and r["wrong_successes"] == 0, r
            continue
        if r["policy"] == "ar":
            assert r["W"] == 1 and r["tau"] is None
            # AR writes one token per forward, but a report's key figures are an infill turn whose
            # holes (trend and target words, between the slots the runtime placed) may be committed
            # several per forward: a report's nfe/token can fall below 1 (its sections dominate it)
            assert r["nfe_per_token"] >= (0.9 if r["task"].startswith("report") else 1.0), r
    assert set(result["targets"]) == set(tasks)


def test_a_paired_run_decodes_each_example_guided_and_unguided() -> None:
    result = _bench_main("quality")(["--quick", "--n", "1", "--tasks", "agent_ood,narrative,infill", "--pair"],
                                    prog="quality")
    for task in ("agent_ood", "narrative"):
        rows = [r for r in result["rows"] if r["task"] == task]
        assert [(r["policy"], r["guided"]) for r in rows] == [(p, g) for p in ("ar", "set", "prefix") for g in (True, False)]
        assert all(r["time_per_token_vs_unguided"] > 0 for r in rows if r["guided"])
        assert result["targets"][task]["ar_fully_correct"] == rows[0]["fully_correct"]
    assert all("guided" not in r for r in result["rows"] if r["task"] == "infill")  # no guide there: one row
    assert result["guided"] == "both"


def test_bad_arguments_exit_with_a_usage_error() -> None:
    main = _bench_main("quality")
    for argv in (["--tasks", "poetry"], ["--n", "0"], ["--threads", "0"], ["--pair", "--unguided"]):
        with pytest.raises(SystemExit) as e:
            main(argv, prog="quality")
        assert e.value.code == 2


def _row(task: str, policy: str, W: int, tau: Any, fc: float, nfe: float, tps: float) -> dict[str, Any]:
    return {"task": task, "policy": policy, "W": W, "tau": tau, "fully_correct": fc, "nfe_per_token": nfe,
            "tokens_per_s": tps}


def test_targets_pick_the_cheapest_set_setting_within_one_point() -> None:
    targets = _bench_main("quality").__globals__["targets"]
    rows = [_row("narrative", "ar", 1, None, 0.97, 1.0, 100.0),
            _row("narrative", "set", 8, 0.9, 0.965, 0.30, 250.0),  # within 1 point
            _row("narrative", "set", 16, 0.7, 0.90, 0.15, 400.0),  # cheaper but 7 points worse
            _row("narrative", "set", 4, 0.9, 0.97, 0.40, 200.0)]
    best = targets(rows)["narrative"]["best_set"]
    assert (best["policy"], best["W"], best["tau"], best["nfe_ratio"], best["speedup_tokens_per_s"]) == \
        ("set", 8, 0.9, 0.3, 2.5)
    assert targets(rows[:1] + rows[2:3])["narrative"]["best_set"] is None
    # any set-decoding policy competes; AR never does
    rows.append(_row("narrative", "prefix", 8, 0.99, 0.97, 0.28, 260.0))
    assert targets(rows)["narrative"]["best_set"]["policy"] == "prefix"


def test_a_verified_answer_with_a_word_no_answer_form_writes_is_a_wrong_success() -> None:
    """The independent reading of an agent's answer: its number, and its words against the
    answer forms' and its task's names (stray_words), not the checker's reader of the forms."""
    quality = _bench_main("quality").__globals__
    calls = [*(f'metric("pop", "{r}", "2002")' for r in ("Ghana", "Bosnia and Herzegovina")), 'calc("1+24716166")']
    task = quality["agent"].Task("What was the total pop across Ghana and Bosnia and Herzegovina in 2002?", calls,
                                 "24716167", "Total pop across Ghana and Bosnia and Herzegovina in 2002 was 24716167.")
    assert quality["stray_words"](task, task.final) == []
    assert quality["stray_words"](task, "Total POP across Ghana and Bosnia and Herzegovina in 2002 was 24716167 k USD.") == []
    assert quality["stray_words"](task, "Total smmmm pop in Ghana and Bosnia and Herzegovina in 2002 was 24716167.") == [
        "smmmm"]
    text = "".join(f"<call>{c}</call><result>{r}</result>\n" for c, r in zip(calls, ("1", "24716166", "24716167")))
    run = {"attempt": "first", "turns": [{"tokens": 1, "nfe": 1}], "verified": True}
    garbled = quality["_answered"](task, {**run, "text": text + "A: Total smmmm pop in Ghana and Bosnia and Herzegovina "
                                          "in 2002 was 24716167.", "answer": "Total smmmm pop in ... was 24716167."}, 0.1)
    assert garbled["wrong"] is True
    right = quality["_answered"](task, {**run, "text": text + "A: " + task.final, "answer": task.final}, 0.1)
    assert right["wrong"] is False and right["ok"] is True
