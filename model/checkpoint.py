"""Checkpoints: a folder with `model.safetensors`, `config.json` and (optionally) `tokenizer.json`.

No pickle: weights are safetensors; optimizer state, when saved, is safetensors + JSON too.
Also computes the model fingerprint that KV blobs carry, and maps the key names of Qwen3-backbone
SetDLM state dicts (the reference's wrappers, anywhere before the Qwen3 name) to setflow's; the
import of a whole released checkpoint is model/importer.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from model import rowdot
from model.config import ModelConfig
from model.transformer import SetDLM, rope_table

WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
# the reference's module wrappers around the Qwen3 names: the denoiser's `backbone`, its
# AutoModelFromPreTrained's `model` and Qwen3ForCausalLM's `model`, torch.compile's `_orig_mod`,
# Composer's `model`, DDP's `module`: e.g. `model.backbone._orig_mod.model.model.layers.0...`
WRAPPERS = frozenset({"backbone", "model", "_orig_mod", "module"})
_QWEN3_NAME = re.compile(r"(?:^|\.)(layers\.\d+\.[\w.]+|embed_tokens\.weight|norm\.weight|lm_head\.weight)$")
# what a released state dict holds that is no weight: the reference's static 2L x 2L training
# mask (a persistent buffer), RoPE's inverse frequencies (older HF Qwen code)
BUFFERS = ("static_attention_mask", "rotary_emb.inv_freq")


def qwen3_name(key: str) -> str | None:
    """setflow's (Qwen3's) name for a source key, or None where the key is not a Qwen3 weight
    under wrappers only (the leftmost Qwen3 name wins: `layers.0.input_layernorm.weight`, not
    `norm.weight`)."""
    m = _QWEN3_NAME.search(key)
    if m is None:
        return None
    prefix = [p for p in key[: m.start(1)].split(".") if p]
    return m.group(1) if set(prefix) <= WRAPPERS else None


def is_buffer(key: str) -> bool:
    return any(key == b or key.endswith("." + b) for b in BUFFERS)


def fingerprint(model: SetDLM) -> str:
    """sha256 over the config and every weight (in their current dtype), in name order, and for
    weights on a CPU the kernels that compute with them (model/rowdot.py name(): their sources,
    flags and this CPU's kinds): a cache is only valid for the exact weights and arithmetic that
    computed it, so workers whose kernels differ never share a session.  The config without max_seq_len: the
    context is a cache size (RoPE is relative), the same K/V at any length, so a longer context
    keeps the sessions and caches of the shorter one.  Computed once per model object and
    kept on it; load_state resets it; anyone else who edits weights in place must pop
    `model._fingerprint` (training builds a fresh model, so it never has one)."""
    fp = getattr(model, "_fingerprint", None)
    if fp is None:
        h = hashlib.sha256(replace(model.cfg, max_seq_len=0).to_json().encode())
        for name, t in sorted(model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        if next(model.parameters()).device.type == "cpu":
            h.update(f"kernels:{rowdot.name()}".encode())
        fp = h.hexdigest()
        model._fingerprint = fp  # type: ignore[assignment]
    return fp


def numerics(model: SetDLM) -> str:
    """Where and in what dtype the model runs: "cpu/float32", "cuda/bfloat16".  Its outputs are
    reproducible only there: a session's K/V and tokens belong to its numerics as to its weights."""
    w = next(model.parameters())
    return f"{w.device.type}/{str(w.dtype).removeprefix('torch.')}"


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


def average(folders: Sequence[str | Path], out: str | Path) -> Path:
    """The mean of several checkpoints' weights, each tensor summed in float64 in the order given
    and then stored in its dtype: the "soup" of fine-tune stages of one model (the shipped model
    is one: README).  They must share the config, the tokenizer and the keys; written all or
    nothing (atomic_folder).  ValueError says which differs."""
    if len(folders) < 2:
        raise ValueError("averaging takes at least two checkpoint folders")
    cfg = load_config(folders[0])
    tokenizers = {(Path(f) / TOKENIZER).read_text() if (Path(f) / TOKENIZER).is_file() else None for f in folders}
    if any(load_config(f) != cfg for f in folders[1:]):
        raise ValueError("the checkpoints hold models of different configs: only one model's weights average")
    if len(tokenizers) > 1:
        raise ValueError("the checkpoints hold different tokenizers: only one model's weights average")
    states = [load_file(str(Path(f) / WEIGHTS)) for f in folders]
    if any(s.keys() != states[0].keys() for s in states[1:]):
        raise ValueError("the checkpoints hold different tensors")
    mean = {}
    for key, first in states[0].items():
        if not first.is_floating_point():
            raise ValueError(f"{key}: only floating-point weights average")
        acc = first.double()
        for s in states[1:]:
            acc = acc + s[key].double()
        mean[key] = (acc / len(states)).to(first.dtype)
    model = SetDLM(cfg)
    load_state(model, mean)
    with atomic_folder(out) as tmp:
        save(model, tmp, tokenizers.pop())
    return Path(out)


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
    """The model in `folder`, in `dtype` on `device`: built empty in `dtype` (empty_model), then
    its weights loaded (a bf16 Qwen3-1.7B's worker peaked at 10 GB for 4.4 GB held, and spent
    most of its 80-105 s start drawing random weights it then overwrote)."""
    folder = Path(folder)
    model = empty_model(load_config(folder), dtype)
    load_weights(model, folder)
    return model.to(device=device).eval()


def empty_model(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> SetDLM:
    """A SetDLM of cfg in `dtype` whose weights are about to be overwritten: built on the meta
    device (no random init of a billion parameters), then given real memory, its embeddings
    re-tied (to_empty unties them) and its RoPE tables (buffers, not in a state dict) computed,
    in `dtype` as SetDLM(cfg).to(dtype) has them."""
    with torch.device("meta"):
        model = SetDLM(cfg)
    model = model.to_empty(device="cpu")
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rope_cos, model.rope_sin = rope_table(cfg)
    return model.to(dtype)


def load_config(folder: str | Path) -> ModelConfig:
    return ModelConfig.from_json((Path(folder) / CONFIG).read_text())


def load_weights(model: SetDLM, folder: str | Path) -> None:
    load_state(model, load_file(str(Path(folder) / WEIGHTS)))


def load_state(model: SetDLM, state: dict[str, torch.Tensor]) -> None:
    """Load a state dict, mapping the reference's key names (qwen3_name) and dropping its buffers;
    missing or unexpected keys are errors."""
    clean = {}
    for key, t in state.items():
        if is_buffer(key):
            continue
        clean[qwen3_name(key) or key] = t
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
