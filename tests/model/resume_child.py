"""Run in a FRESH process by test_resume.py: load a checkpoint and paused sessions from disk,
continue each to the end, and write the tokens and per-step logits back."""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from model import checkpoint
from model.params import DecodeParams, DecodeState
from model.decode import decode
from model.kv_cache import KVCache


def main(folder: str) -> None:
    torch.set_num_threads(1)
    root = Path(folder)
    model = checkpoint.load(root / "model")
    fp = checkpoint.fingerprint(model)
    results: dict[str, object] = {}
    tensors = {}
    for d in sorted(p for p in root.iterdir() if p.name.startswith("pause-")):
        cache = KVCache.from_bytes((d / "kv.bin").read_bytes(), fp)
        state = DecodeState.from_json((d / "state.json").read_text())
        params = DecodeParams(**json.loads((d / "params.json").read_text()))
        for i, ev in enumerate(decode(model, cache, state, params)):
            tensors[f"{d.name}.{i}"] = ev.logits.contiguous()
        results[d.name] = {"tokens": state.tokens, "cache": cache.to_bytes(fp).hex()}
    (root / "child.json").write_text(json.dumps(results))
    save_file(tensors, str(root / "child.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1])
