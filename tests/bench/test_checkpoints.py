"""bench/checkpoints.py: at the tiny shape, each layout it writes is what `setflow import` accepts,
and a checkpoint written in shards (HF's index and -of- files) imports to the weights drawn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from app.cli import _bench_main, main
from bench.checkpoints import LAYOUTS, qwen3_tensors
from model import shipped
from model.importer import import_checkpoint


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_is_what_setflow_import_accepts(layout: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    result = _bench_main("checkpoints")(["--shape", "tiny", "--layout", layout, "--out", str(tmp_path / "src")],
                                        prog="checkpoints")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == result and result["bench"] == "checkpoints" and result["bytes"] > 0
    tok = ["--tokenizer", result["tokenizer"]] if layout == "composer" else []  # a Composer run holds none
    assert main(["import", result["src"], "--dry-run", *tok]) == 0
    out = capsys.readouterr().out
    # the embedding, its tied lm_head, the final norm and 11 tensors in each of 2 layers
    assert "maps: 25 tensors" in out and "imported as tied embeddings" in out and "importable" in out
    assert "config.rope_theta = 1000000.0 <- the public config of Qwen/Qwen3-1.7B-Base" in out


def test_a_sharded_checkpoint_imports_the_weights_drawn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = _bench_main("checkpoints")(["--shape", "tiny", "--out", str(tmp_path / "src"), "--shard-mb", "1",
                                         "--seed", "3"], prog="checkpoints")
    src = Path(result["src"])
    index = json.loads((src / "model.safetensors.index.json").read_text())
    shards = sorted({f for f in index["weight_map"].values()})
    assert len(shards) == 3 and all((src / f).is_file() for f in shards)  # the embedding, the layers, the mask
    assert shards[0] == "model-00001-of-00003.safetensors" and not list(src.glob("*.part"))
    import_checkpoint(src, tmp_path / "out")
    model, _ = shipped.load(tmp_path / "out", dtype=torch.bfloat16)
    got = model.state_dict()
    for name, t in qwen3_tensors("tiny", seed=3, dtype=torch.bfloat16):
        assert got[name.removeprefix("model.")].dtype == torch.bfloat16 and torch.equal(got[name.removeprefix("model.")], t), name


def test_bad_arguments_exit_with_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for bad in ([], ["--serve", "--out", str(tmp_path / "a")], ["--serve", "--dtypes", "fp8"],
                ["--shape", "qwen3-70b", "--serve"], ["--out", str(tmp_path / "full")],
                ["--out", str(tmp_path / "b"), "--shard-mb", "0"]):
        with pytest.raises(SystemExit) as e:
            _bench_main("checkpoints")(bad, prog="checkpoints")
        assert e.value.code == 2


@pytest.mark.slow  # starts a worker process per dtype
def test_serve_imports_the_checkpoint_and_a_worker_in_each_dtype_runs_a_job(capsys: pytest.CaptureFixture[str]) -> None:
    result = _bench_main("checkpoints")(["--shape", "tiny", "--serve", "--new-tokens", "4"], prog="checkpoints")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == result and result["model"] == "tiny-random" and result["imported_bytes"] > 0
    assert [r["dtype"] for r in result["rows"]] == ["float32", "bfloat16"]
    for r in result["rows"]:
        assert r["ran_on"] == f"ck-{r['dtype']}" and 0 < r["tokens"] <= 4 and r["peak_rss_mb"] > 0 < r["rss_ready_mb"]
        assert r["worker_ready_s"] >= r["worker_alive_s"] > 0 and r["first_job_ms"] > r["decode_ms"] > 0
