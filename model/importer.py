"""Import of the reference's released SetDLM checkpoints (kuleshov-group/setdlms) into setflow's
format: safetensors + config.json + tokenizer.json + profile.json (model/checkpoint.py,
model/profiles.py).

Reads the three layouts the reference writes: its Hugging Face export (`config.json` of model type
bd3lm/setdlm naming its base model, `pytorch_model.bin` or safetensors, keys
`backbone.model.model.*`), a compiled backbone's keys (`backbone._orig_mod.model.*`) and Composer
checkpoints (`config.yaml` + `checkpoints/*.pt`, keys `model.backbone._orig_mod.*`).  Pickles are
read only by `torch.load(weights_only=True)`: one that holds anything but tensors and plain
containers is refused.  Knows nothing about sessions or workflows; the Qwen3 shape comes from the
weights, the numerics (RoPE theta, RMSNorm eps) from the base model's config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml  # type: ignore[import-untyped]
from safetensors.torch import load_file

from model import checkpoint
from model.config import ModelConfig
from model.profiles import PROFILE, Profile
from model.tokenizer import SpecialIds, Tokenizer
from model.transformer import SetDLM

# what torch.load(weights_only=True) raises for a pickle that holds more than tensors (its own
# import of the pickle module: setflow imports none)
_UnpicklingError = torch.serialization.pickle.UnpicklingError  # type: ignore[attr-defined]
_DIT_KEYS = ("vocab_embed.embedding", "blocks.0.attn_qkv.weight", "output_layer.linear.weight")

# the numerics of the public Qwen3 base models (their config.json): what the weights cannot say.
# Every dense Qwen3 uses theta 1e6 and eps 1e-6; the small ones tie their embeddings.
QWEN3_BASES: dict[str, dict[str, Any]] = {
    f"qwen3-{size}": {"rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": tie,
                      "max_position_embeddings": 32768}
    for size, tie in (("0.6b", True), ("1.7b", True), ("4b", True), ("8b", False), ("14b", False), ("32b", False))
}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class ImportRefused(ValueError):
    """A checkpoint setflow cannot import as it is: the message says why and what would do."""

    code = "import_refused"


@dataclass
class ImportPlan:
    """What an import would do: the config it maps (and from where), the weights that map, what
    is dropped and what does not map.  `ok` when nothing blocks the import."""

    source: str
    config: ModelConfig | None = None
    fields: dict[str, str] = field(default_factory=dict)  # ModelConfig field -> "value <- source"
    mapped: dict[str, str] = field(default_factory=dict)  # setflow name -> source key
    dropped: dict[str, str] = field(default_factory=dict)  # source key -> why
    unmapped: list[str] = field(default_factory=list)  # source keys that fit nothing
    problems: list[str] = field(default_factory=list)  # what blocks the import
    notes: list[str] = field(default_factory=list)  # what the user should know
    weight_files: list[str] = field(default_factory=list)
    tokenizer: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unmapped and self.config is not None

    def lines(self) -> list[str]:
        out = [f"source: {self.source}", f"weights: {', '.join(self.weight_files) or '-'}",
               f"tokenizer: {self.tokenizer or '-'}"]
        out += [f"config.{k} = {v}" for k, v in self.fields.items()]
        out.append(f"maps: {len(self.mapped)} tensors")
        out += [f"drops: {k} ({why})" for k, why in self.dropped.items()]
        out += [f"does not map: {k}" for k in self.unmapped]
        out += [f"note: {n}" for n in self.notes]
        out += [f"refused: {p}" for p in self.problems]
        return out


# -- reading the source ---------------------------------------------------------------------------

def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """One weight file: safetensors, or a pickle (.bin/.pt) through torch.load(weights_only=True).
    A Composer checkpoint's model state is taken out of its `state`."""
    if path.suffix == ".safetensors":
        return load_file(str(path))
    if path.suffix not in (".bin", ".pt", ".pth", ".ckpt"):
        raise ImportRefused(f"{path.name}: unknown weight format (safetensors, or .bin/.pt tensors)")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (_UnpicklingError, RuntimeError, AttributeError, TypeError, ValueError, EOFError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ImportRefused(
            f"{path.name} is not a pickle of plain tensors ({first[:200]}): setflow reads pickles only "
            "with torch.load(weights_only=True), which runs no code; export the weights as safetensors "
            "(or a state dict of tensors) and import that") from None
    return _state_dict_in(obj, path.name)


def _state_dict_in(obj: Any, name: str) -> dict[str, torch.Tensor]:
    """The state dict inside a loaded pickle: itself, or Composer's state.model, or a `state_dict`."""
    for path in ((), ("state", "model"), ("state_dict",), ("model",), ("module",)):
        cur = obj
        for k in path:
            cur = cur.get(k) if isinstance(cur, dict) else None
        if isinstance(cur, dict) and cur and all(isinstance(v, torch.Tensor) for v in cur.values()):
            return cur
    raise ImportRefused(f"{name} holds no state dict of tensors (looked at the top, state.model, state_dict, model)")


def find_weight_files(src: Path) -> list[Path]:
    if src.is_file():
        return [src]
    for idx in INDEX_FILES:  # sharded: the index names the shards
        if (src / idx).is_file():
            shards = sorted(set(json.loads((src / idx).read_text())["weight_map"].values()))
            return [src / s for s in shards]
    for name in WEIGHT_FILES:
        if (src / name).is_file():
            return [src / name]
    for pattern in ("*.safetensors", "*.bin", "checkpoints/*.pt", "*.pt"):
        found = sorted(src.glob(pattern))
        if found:
            if len(found) > 1 and pattern.endswith(".pt"):  # Composer keeps several: prefer best, then latest
                best = [p for p in found if p.name.startswith("best")] or [p for p in found if "latest" in p.name]
                found = best[:1] or found[-1:]
            return found
    raise ImportRefused(f"{src}: no weights found ({', '.join(WEIGHT_FILES)}, *.safetensors, *.bin, checkpoints/*.pt)")


def read_reference_config(src: Path, explicit: Path | None = None) -> dict[str, Any]:
    """The reference's config: config.json (the HF export), or a Composer run's config.yaml (the
    dict in it that holds `backbone_config`)."""
    folder = src if src.is_dir() else src.parent
    candidates = [explicit] if explicit is not None else [folder / "config.json", folder / "config.yaml",
                                                          folder.parent / "config.yaml"]
    for path in candidates:
        if path is None or not path.is_file():
            continue
        if path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(path.read_text())  # safe_load: plain data only
        else:
            data = json.loads(path.read_text())
        found = _dict_with(data, "backbone_config")
        if found is not None:
            return found
        if isinstance(data, dict) and data.get("model_type") in ("bd3lm", "setdlm", "denoiser", "mdlm"):
            return data
        if isinstance(data, dict) and "d_model" in data and "n_layers" in data:
            raise ImportRefused(f"{path} is already a setflow config: load the folder with model.checkpoint.load")
    raise ImportRefused(f"{folder}: no reference config (config.json of model type bd3lm, or a Composer config.yaml); "
                        "pass --config")


def _dict_with(data: Any, key: str) -> dict[str, Any] | None:
    if isinstance(data, dict):
        if key in data:
            return data
        for v in data.values():
            found = _dict_with(v, key)
            if found is not None:
                return found
    return None


def base_numerics(backbone: dict[str, Any], base_config: Path | None) -> tuple[dict[str, Any], str]:
    """The base model's config (RoPE theta, RMSNorm eps, tied embeddings): --base-config, the base
    model's folder when its name is a local path, or the public Qwen3 table.  (config, its source)"""
    if base_config is not None:
        return json.loads(base_config.read_text()), str(base_config)
    name = str(backbone.get("pretrained_model_name_or_path") or "")
    if name and (Path(name) / "config.json").is_file():
        return json.loads((Path(name) / "config.json").read_text()), f"{name}/config.json"
    key = name.rsplit("/", 1)[-1].lower().removesuffix("-base")
    if key in QWEN3_BASES:
        return dict(QWEN3_BASES[key]), f"the public config of {name}"
    raise ImportRefused(f"base model {name or '(unnamed)'} is not a known Qwen3 base and is not a local folder: "
                        "pass its config.json with --base-config")


# -- mapping ------------------------------------------------------------------------------------

def map_keys(state: dict[str, torch.Tensor], plan: ImportPlan) -> dict[str, torch.Tensor]:
    """Source keys -> setflow's (Qwen3) names, wherever the wrappers put them; the reference's
    buffers are dropped; keys that fit nothing are listed in plan.unmapped."""
    out: dict[str, torch.Tensor] = {}
    for key, t in state.items():
        if checkpoint.is_buffer(key):
            plan.dropped[key] = "a buffer the reference saves (rebuilt from the config), not a weight"
            continue
        name = checkpoint.qwen3_name(key)
        if name is None:
            plan.unmapped.append(key)
            continue
        if name in out:
            plan.problems.append(f"two source keys map to {name}: {plan.mapped[name]} and {key}")
            continue
        out[name] = t
        plan.mapped[name] = key
    if any(any(k.endswith(d) for d in _DIT_KEYS) for k in state):
        plan.problems.append("a DiT backbone (the OWT/LM1B models): setflow runs Qwen3-shaped backbones only")
    return out


def _shape(weights: dict[str, torch.Tensor], plan: ImportPlan) -> dict[str, Any]:
    """The Qwen3 shape as the weights tell it."""
    need = ["embed_tokens.weight", "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
            "layers.0.self_attn.q_norm.weight", "layers.0.mlp.gate_proj.weight"]
    missing = [n for n in need if n not in weights]
    if missing:
        raise ImportRefused(f"not a Qwen3 backbone: no {', '.join(missing)} among the mapped weights")
    V, d = weights["embed_tokens.weight"].shape
    D = weights["layers.0.self_attn.q_norm.weight"].shape[0]
    n_layers = 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("layers."))
    lm = weights.get("lm_head.weight")
    tied = lm is None or (lm.shape == weights["embed_tokens.weight"].shape
                          and torch.equal(lm, weights["embed_tokens.weight"]))
    if lm is not None and tied:
        plan.notes.append("lm_head.weight equals embed_tokens.weight: imported as tied embeddings")
    return dict(vocab_size=int(V), d_model=int(d), n_layers=n_layers, head_dim=int(D),
                n_heads=weights["layers.0.self_attn.q_proj.weight"].shape[0] // D,
                n_kv_heads=weights["layers.0.self_attn.k_proj.weight"].shape[0] // D,
                d_ff=int(weights["layers.0.mlp.gate_proj.weight"].shape[0]), tie_embeddings=tied)


def _special_ids(ref: dict[str, Any], tok_dir: Path | None, tok: Tokenizer | None) -> tuple[dict[str, int | None], str]:
    """mask/pad/bos/eos from the reference's tokenization_config (or its top-level fields), else
    from tokenizer_config.json's token names; never assumed."""
    tc = {**{k: ref.get(k) for k in ("mask_token_id", "pad_token_id", "bos_token_id", "eos_token_id")},
          **{k: v for k, v in (ref.get("tokenization_config") or {}).items() if v is not None}}
    ids: dict[str, int | None] = {k.removesuffix("_token_id"): tc.get(k) for k in
                                  ("mask_token_id", "pad_token_id", "bos_token_id", "eos_token_id")}
    source = "tokenization_config"
    tcfg = tok_dir / "tokenizer_config.json" if tok_dir is not None else None
    if any(v is None for v in ids.values()) and tcfg is not None and tcfg.is_file() and tok is not None:
        names = json.loads(tcfg.read_text())
        for k, v in ids.items():
            t = names.get(f"{k}_token")
            t = t.get("content") if isinstance(t, dict) else t
            if v is None and isinstance(t, str) and tok.has_token(t):
                ids[k] = tok.token_id(t)
        source += " + tokenizer_config.json"
    return ids, source


def plan_import(src: str | Path, *, config: Path | None = None, base_config: Path | None = None,
                tokenizer: Path | None = None, name: str | None = None,
                weights: dict[str, torch.Tensor] | None = None) -> tuple[ImportPlan, dict[str, torch.Tensor]]:
    """Everything but the writing: the plan and the mapped weights.  ImportRefused for a source
    that cannot be read at all; a plan with problems for one that reads but does not fit."""
    src = Path(src)
    if not src.exists():
        raise ImportRefused(f"{src} does not exist")
    plan = ImportPlan(str(src))
    ref = read_reference_config(src, config)
    backbone = ref.get("backbone_config") or {}
    target = str(backbone.get("_target_", ""))
    if "dit" in target.lower():
        plan.problems.append(f"backbone {target}: a DiT (the OWT/LM1B models); setflow runs Qwen3-shaped backbones")
    if weights is None:
        files = find_weight_files(src)
        plan.weight_files = [str(f) for f in files]
        weights = {}
        for f in files:
            weights.update(read_weights(f))
    mapped = map_keys(weights, plan)
    if plan.problems or plan.unmapped:
        return plan, mapped
    shape = _shape(mapped, plan)
    base, base_src = base_numerics(backbone, base_config)
    for k, v in shape.items():
        plan.fields[k] = f"{v} <- the weights"

    # the tokenizer and the special ids
    tok_path = tokenizer or ((src if src.is_dir() else src.parent) / checkpoint.TOKENIZER)
    tok = Tokenizer.from_file(tok_path, SpecialIds(0, 0, 0, 0, None)) if tok_path.is_file() else None
    if tok is None:
        plan.problems.append(f"no tokenizer.json beside the weights ({tok_path}): pass --tokenizer")
    else:
        plan.tokenizer = str(tok_path)
    ids, ids_src = _special_ids(ref, tok_path.parent if tok is not None else None, tok)
    if ids["mask"] is None:
        plan.problems.append("no mask token id (tokenization_config.mask_token_id): the model cannot decode without it")
    if ids["eos"] is None:
        plan.problems.append("no eos token id (tokenization_config.eos_token_id)")
    bos = ids["bos"] if ids["bos"] is not None else ids["eos"]
    pad = ids["pad"] if ids["pad"] is not None else ids["eos"]
    # the reference masks no documents; a BOS that is also the EOS (Qwen's <|endoftext|>) would
    # open a document at every EOS, so such a model gets no document boundaries
    doc_start = None if bos == ids["eos"] or ids["bos"] is None else bos
    for k, v in (("mask_id", ids["mask"]), ("pad_id", pad), ("bos_id", bos), ("eos_id", ids["eos"]),
                 ("doc_start_id", doc_start)):
        plan.fields[k] = f"{v} <- {ids_src}" if k != "doc_start_id" else (
            f"{v} <- " + ("none: BOS is EOS (or absent)" if v is None else "BOS"))

    # the set sizes and the length
    noise = ref.get("noise_config") or {}
    d = int(noise.get("desired_block_size") or 1)
    smax = noise.get("max_block_size")
    plan.fields["set_size"] = f"{d} <- noise_config.desired_block_size"
    plan.fields["max_set_size"] = f"{2 * d} <- 2 * set_size (the reference's eval loader rebuilds smax = 2d)"
    if smax is not None and int(smax) != 2 * d:
        plan.notes.append(f"noise_config.max_block_size {smax} overridden by 2d = {2 * d}, as the reference's eval does")
    length = next((int(v) for v in (ref.get("length"), ref.get("max_length"), ref.get("model_length"),
                                    noise.get("length"), base.get("max_position_embeddings")) if v), 0)
    plan.fields["max_seq_len"] = f"{length} <- the trained length"
    plan.fields["rope_theta"] = f"{base.get('rope_theta', 10000.0)} <- {base_src}"
    plan.fields["rms_eps"] = f"{base.get('rms_norm_eps', 1e-6)} <- {base_src}"
    if not shape["tie_embeddings"] and base.get("tie_word_embeddings") is True:
        plan.notes.append("the base ties its embeddings, these weights have their own lm_head: kept untied")
    if plan.problems:
        return plan, mapped
    assert ids["mask"] is not None and ids["eos"] is not None and bos is not None and pad is not None
    try:
        plan.config = ModelConfig(
            name=name or (src.name if src.is_dir() else src.parent.name), **shape, max_seq_len=length,
            rope_theta=float(base.get("rope_theta", 10000.0)), rms_eps=float(base.get("rms_norm_eps", 1e-6)),
            set_size=d, max_set_size=2 * d, pad_id=pad, mask_id=ids["mask"], bos_id=bos, eos_id=ids["eos"],
            doc_start_id=doc_start)
    except ValueError as e:
        plan.problems.append(f"the mapped config is invalid: {e}")
        return plan, mapped
    if tok is not None and tok.vocab_size > plan.config.vocab_size:
        plan.problems.append(f"the tokenizer has {tok.vocab_size} tokens > the model's {plan.config.vocab_size}")
    with torch.device("meta"):  # the names only: no memory
        names = set(SetDLM(plan.config).state_dict())
    plan.unmapped += [plan.mapped[k] for k in sorted(set(mapped) - names - {"lm_head.weight"})]
    missing = sorted(names - set(mapped) - ({"lm_head.weight"} if plan.config.tie_embeddings else set()))
    if missing:
        plan.problems.append(f"weights missing: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    return plan, mapped


def import_checkpoint(src: str | Path, out: str | Path, *, config: Path | None = None,
                      base_config: Path | None = None, tokenizer: Path | None = None,
                      name: str | None = None, profile: Profile | None = None) -> ImportPlan:
    """Convert `src` into setflow's format in `out` (all or nothing); ImportRefused with every
    problem when the plan is not ok."""
    plan, weights = plan_import(src, config=config, base_config=base_config, tokenizer=tokenizer, name=name)
    if not plan.ok:
        raise ImportRefused("; ".join(plan.problems + [f"does not map: {k}" for k in plan.unmapped[:8]]))
    assert plan.config is not None and plan.tokenizer is not None
    dtype = max((t.dtype for t in weights.values() if t.is_floating_point()),
                key=lambda dt: sum(t.numel() for t in weights.values() if t.dtype == dt))
    model = checkpoint.empty_model(plan.config, dtype)
    try:
        checkpoint.load_state(model, weights)
    except (ValueError, RuntimeError) as e:
        raise ImportRefused(f"the weights do not fit the mapped config: {e}") from None
    tok_json = Path(plan.tokenizer).read_text(encoding="utf-8")
    Tokenizer.from_str(tok_json, SpecialIds.of(plan.config))  # the special ids lie in its vocabulary
    prof = profile or Profile.for_model(plan.config, Tokenizer.from_str(tok_json, SpecialIds.of(plan.config)))
    with checkpoint.atomic_folder(out) as tmp:
        checkpoint.save(model, tmp, tokenizer_json=tok_json)
        (tmp / PROFILE).write_text(prof.to_json())
        (tmp / "import.json").write_text(json.dumps({"source": plan.source, "fields": plan.fields,
                                                     "dropped": plan.dropped, "notes": plan.notes}, indent=1))
    return plan

