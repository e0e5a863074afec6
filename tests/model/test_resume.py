"""I11: pause after any step (pending set included), serialise (the cache as K/V segments and its
ledger, the state as JSON), load (in this process and in a FRESH process), continue: identical
tokens, logits and cache as the uninterrupted run."""

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from model import checkpoint
from model.decode import begin_turn, decode
from model.kv_cache import KVCache
from model.params import DecodeParams, DecodeState
from model.transformer import SetDLM
from runtime.sessions import kv
from tests.fakes import PROMPT, assert_same_cache
from tests.model.resume_child import read_cache, write_cache

ROOT = Path(__file__).resolve().parents[2]
PARAMS = [DecodeParams(policy="set", window=5, tau=0.2, max_new_tokens=24),
          DecodeParams(policy="block", window=4, tau=0.3, max_new_tokens=20),
          DecodeParams(policy="set", window=4, tau=0.3, max_new_tokens=20, temperature=0.8, seed=5)]


def _run(model: SetDLM, params: DecodeParams, pause: int | None = None):
    """Uninterrupted run, or one paused after `pause` steps and returned mid-way."""
    cache = KVCache.for_model(model.cfg)
    state = begin_turn(model, cache, None, PROMPT, params)
    logits = []
    for i, ev in enumerate(decode(model, cache, state, params)):
        logits.append(ev.logits)
        if pause is not None and i + 1 == pause:
            break
    return cache, state, logits


def _save(cache: KVCache, fp: str) -> list[bytes]:
    return kv.to_segments(cache, 0, cache.length, fp, 1 << 16)  # several segments


@pytest.mark.parametrize("params", PARAMS, ids=["set", "block", "sampled"])
def test_I11_round_trip_in_process_for_every_pause(model: SetDLM, params: DecodeParams) -> None:
    fp = checkpoint.fingerprint(model)[:16]
    ref_cache, ref_state, ref_logits = _run(model, params)
    assert len(ref_logits) >= 4, "a sweep needs several steps"
    for s in range(1, len(ref_logits)):
        cache, state, logits = _run(model, params, pause=s)
        blobs, text = _save(cache, fp), state.to_json()
        cache2, state2 = kv.from_segments(blobs, fp, cache.positions, cache.tokens), DecodeState.from_json(text)
        assert _save(cache2, fp) == blobs and state2.to_json() == text, "byte-identical round trip"
        logits += [ev.logits for ev in decode(model, cache2, state2, params)]
        assert state2.tokens == ref_state.tokens, f"paused after step {s}"
        assert state2.pending == ref_state.pending
        assert_same_cache(ref_cache, cache2)
        for a, b in zip(logits, ref_logits, strict=True):
            assert torch.equal(a, b)


@pytest.mark.slow
def test_I11_resume_in_a_fresh_process(model: SetDLM, tmp_path: Path) -> None:
    checkpoint.save(model, tmp_path / "model")
    loaded = checkpoint.load(tmp_path / "model")
    fp = checkpoint.fingerprint(loaded)[:16]
    expected = {}
    for k, params in enumerate(PARAMS):
        ref_cache, ref_state, ref_logits = _run(loaded, params)
        assert len(ref_logits) >= 4
        for s in sorted({1, len(ref_logits) // 2, len(ref_logits) - 1}):  # always steps left to run
            cache, state, logits = _run(loaded, params, pause=s)
            assert state.pending, "pause with a non-empty pending set"
            d = tmp_path / f"pause-{k}-{s}"
            d.mkdir()
            write_cache(d, cache, fp)
            (d / "state.json").write_text(state.to_json())
            (d / "params.json").write_text(json.dumps(asdict(params)))
            expected[d.name] = (ref_state.tokens, ref_cache, ref_logits[s:])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "tests.model.resume_child", str(tmp_path)], check=True,
                   cwd=ROOT, env=env, timeout=120)
    got = json.loads((tmp_path / "child.json").read_text())
    logits = load_file(str(tmp_path / "child.safetensors"))
    for name, (tokens, ref_cache, ref_logits) in expected.items():
        assert got[name]["tokens"] == tokens, name
        assert sum(k.startswith(name + ".") for k in logits) == len(ref_logits) > 0, "same number of steps"
        assert_same_cache(ref_cache, read_cache(tmp_path / name / "out", fp))
        for i, ref in enumerate(ref_logits):
            # same build and thread count: bitwise; the tolerance only guards other builds
            torch.testing.assert_close(logits[f"{name}.{i}"], ref, atol=1e-6, rtol=0)
            assert torch.equal(logits[f"{name}.{i}"].argmax(-1), ref.argmax(-1))

