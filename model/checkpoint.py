"""Checkpoints: a folder with `model.safetensors`, `config.json` and (optionally) `tokenizer.json`.

No pickle: weights are safetensors; optimizer state, when saved, is safetensors + JSON too.
Also computes the model fingerprint that KV blobs carry, and imports Qwen3-backbone SetDLM
state dicts by stripping their prefixes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from model.config import ModelConfig
from model.transformer import SetDLM

WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
# prefixes seen in released checkpoints: HF export (`backbone.model.`), compiled models (`_orig_mod.`)
_PREFIXES = ("backbone.model.model.", "backbone.model.", "backbone.", "_orig_mod.", "model.")


def fingerprint(model: SetDLM) -> str:
    """sha256 over the config and every weight (in their current dtype), in name order: a cache
    is only valid for the exact weights that computed it.  Computed once per model object and
    kept on it; load_state resets it; anyone else who edits weights in place must pop
    `model._fingerprint` (training builds a fresh model, so it never has one)."""
    fp = getattr(model, "_fingerprint", None)
    if fp is None:
        h = hashlib.sha256(model.cfg.to_json().encode())
        for name, t in sorted(model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        fp = h.hexdigest()
        model._fingerprint = fp  # type: ignore[assignment]
    return fp


def save(model: SetDLM, folder: str | Path, tokenizer_json: str | None = None) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.cfg.tie_embeddings:
        state.pop("lm_head.weight", None)  # shared with embed_tokens; safetensors refuses aliases
    save_file(state, str(folder / WEIGHTS))
    (folder / CONFIG).write_text(model.cfg.to_json())
    if tokenizer_json is not None:
        (folder / TOKENIZER).write_text(tokenizer_json)
    return folder


@contextmanager
def atomic_folder(folder: str | Path) -> Iterator[Path]:
    """Write a folder all or nothing: the caller fills a sibling temp folder, which then replaces
    `folder` by renames.  A crash leaves the previous folder (or, between the two renames, its
    `.old` copy, which `recover` puts back), never a mix of two saves."""
    folder = Path(folder)
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def recover(folder: str | Path) -> None:
    """Undo a save interrupted between atomic_folder's two renames."""
    folder = Path(folder)
    old = folder.with_name(folder.name + ".old")
    if not folder.exists() and old.exists():
        old.rename(folder)


def load(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> SetDLM:
    folder = Path(folder)
    model = SetDLM(load_config(folder))
    load_weights(model, folder)
    return model.to(device=device, dtype=dtype).eval()


def load_config(folder: str | Path) -> ModelConfig:
    return ModelConfig.from_json((Path(folder) / CONFIG).read_text())


def load_weights(model: SetDLM, folder: str | Path) -> None:
    load_state(model, load_file(str(Path(folder) / WEIGHTS)))


def load_state(model: SetDLM, state: dict[str, torch.Tensor]) -> None:
    """Load a state dict, stripping known prefixes; missing or unexpected keys are errors."""
    clean = {}
    for name, t in state.items():
        for p in _PREFIXES:
            if name.startswith(p):
                name = name[len(p):]
                break
        clean[name] = t
    if model.cfg.tie_embeddings:
        clean.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(clean, strict=False)
    missing = [m for m in missing if not (model.cfg.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"checkpoint does not fit the model: missing {missing}, unexpected {unexpected}")
    model.__dict__.pop("_fingerprint", None)


def save_optimizer(opt: torch.optim.Optimizer, folder: Path, meta: dict[str, object]) -> None:
    """AdamW state as safetensors (tensors) + JSON (scalars and the training meta)."""
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for key, val in st.items():
            if torch.is_tensor(val) and val.dim() > 0:
                tensors[f"{pid}.{key}"] = val.contiguous()
            else:
                scalars[f"{pid}.{key}"] = float(val)
    save_file(tensors, str(folder / "optimizer.safetensors"))
    (folder / "trainer.json").write_text(json.dumps({"param_groups": sd["param_groups"],
                                                     "scalars": scalars, **meta}))


def load_optimizer(opt: torch.optim.Optimizer, folder: Path) -> dict[str, Any]:
    meta = json.loads((folder / "trainer.json").read_text())
    tensors = load_file(str(folder / "optimizer.safetensors"))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = t
    for name, val in meta.pop("scalars").items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = torch.tensor(val)
    opt.load_state_dict({"state": state, "param_groups": meta.pop("param_groups")})
    return meta
