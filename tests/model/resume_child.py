"""Run in a FRESH process by test_resume.py: load a checkpoint and paused sessions from disk (the
cache as K/V segments beside its ledger), continue each to the end, and write the tokens, the
final cache and the per-step logits back."""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from model import checkpoint
from model.decode import decode
from model.kv_cache import KVCache
from model.params import DecodeParams, DecodeState
from runtime.sessions import kv


def write_cache(folder: Path, cache: KVCache, fp: str) -> None:
    """The cache's slots as segment files kv-0.bin, kv-1.bin, ... and its ledger as ledger.json."""
    folder.mkdir(exist_ok=True)
    for i, blob in enumerate(kv.to_segments(cache, 0, cache.length, fp, 1 << 16)):
        (folder / f"kv-{i}.bin").write_bytes(blob)
    (folder / "ledger.json").write_text(json.dumps([cache.positions, cache.tokens]))


def read_cache(folder: Path, fp: str) -> KVCache:
    positions, tokens = json.loads((folder / "ledger.json").read_text())
    n = len(list(folder.glob("kv-*.bin")))
    return kv.from_segments([(folder / f"kv-{i}.bin").read_bytes() for i in range(n)], fp, positions, tokens)


def main(folder: str) -> None:
    torch.set_num_threads(1)
    root = Path(folder)
    model = checkpoint.load(root / "model")
    fp = checkpoint.fingerprint(model)[:16]
    results: dict[str, object] = {}
    tensors = {}
    for d in sorted(p for p in root.iterdir() if p.name.startswith("pause-")):
        cache = read_cache(d, fp)
        state = DecodeState.from_json((d / "state.json").read_text())
        params = DecodeParams(**json.loads((d / "params.json").read_text()))
        for i, ev in enumerate(decode(model, cache, state, params)):
            tensors[f"{d.name}.{i}"] = ev.logits.contiguous()
        results[d.name] = {"tokens": state.tokens}
        write_cache(d / "out", cache, fp)
    (root / "child.json").write_text(json.dumps(results))
    save_file(tensors, str(root / "child.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1])
