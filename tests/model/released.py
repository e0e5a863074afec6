"""Synthetic released checkpoints: tiny random Qwen3 weights written in each layout the reference
(kuleshov-group/setdlms) saves, with its config fields and key names, and a Qwen-style
tokenizer.json (special ids past 151k, BOS = EOS) built with `tokenizers`: no download."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

# Qwen3's vocabulary: 151643 BPE tokens, then its special tokens from 151643; the model's
# embedding has 151936 rows.  The reference's [MASK] for Qwen3 is <|fim_middle|>.
QWEN_BPE, QWEN_VOCAB = 151643, 151936
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *[f"<|reserved_{i}|>" for i in range(11)],
                 "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]
ENDOFTEXT, IM_START, IM_END = 151643, 151644, 151645
MASK = QWEN_BPE + QWEN_SPECIALS.index("<|fim_middle|>")  # 151660
BASE = "Qwen/Qwen3-1.7B-Base"
LENGTH, SET_SIZE = 1024, 2
LAYOUTS = ("hf_bin", "hf_safetensors", "compiled", "composer")
# the tiny shape every test model has (heads of 16 as Qwen3's of 128, in miniature)
SHAPE = dict(hidden=32, layers=2, heads=4, kv_heads=2, head_dim=16, ff=64)


@lru_cache(maxsize=1)
def qwen_tokenizer_json() -> str:
    """Byte-level BPE with Qwen's layout: the 256 byte symbols and a few merges first, filler up to
    151643, then the special tokens at Qwen's ids."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    merges = [("t", "h"), ("th", "e"), ("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e"), ("i", "n"), ("e", "r")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    for i in range(len(vocab), QWEN_BPE):
        vocab[f"<unused{i}>"] = i
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(QWEN_SPECIALS)
    assert hf.token_to_id("<|endoftext|>") == ENDOFTEXT and hf.token_to_id("<|fim_middle|>") == MASK
    return hf.to_str()


def qwen3_state(seed: int = 0, tie: bool = True) -> dict[str, torch.Tensor]:
    """Random weights under Qwen3ForCausalLM's names, sharpened (std 0.3: varied confidences)
    and with norms away from 1 (a norm mapped to the wrong place would show)."""
    g = torch.Generator().manual_seed(seed)
    s = SHAPE
    H, Hkv, D, d, f = s["heads"], s["kv_heads"], s["head_dim"], s["hidden"], s["ff"]

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.3

    def norm(n: int) -> torch.Tensor:
        return 0.5 + torch.rand(n, generator=g)

    state = {"model.embed_tokens.weight": w(QWEN_VOCAB, d), "model.norm.weight": norm(d)}
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        state |= {p + "self_attn.q_proj.weight": w(H * D, d), p + "self_attn.k_proj.weight": w(Hkv * D, d),
                  p + "self_attn.v_proj.weight": w(Hkv * D, d), p + "self_attn.o_proj.weight": w(d, H * D),
                  p + "self_attn.q_norm.weight": norm(D), p + "self_attn.k_norm.weight": norm(D),
                  p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d),
                  p + "mlp.down_proj.weight": w(d, f),
                  p + "input_layernorm.weight": norm(d), p + "post_attention_layernorm.weight": norm(d)}
    state["lm_head.weight"] = state["model.embed_tokens.weight"] if tie else w(QWEN_VOCAB, d)
    return state


def reference_config() -> dict[str, object]:
    """config.json as the reference's HF export writes it (a BD3LMConfig naming its base model)."""
    return {
        "model_type": "bd3lm", "architectures": ["SetDLM"],
        "auto_map": {"AutoConfig": "denoiser_base.BD3LMConfig", "AutoModelForMaskedLM": "denoiser_setdlm.SetDLM"},
        "length": LENGTH, "block_size": LENGTH, "eval_block_size": LENGTH, "attn_backend": "sdpa",
        "backbone_config": {"_target_": "backbone_automodel.AutoModelFromPreTrained",
                            "automodel_cls": "CustomQwen3ForCausalLM", "pretrained_model_name_or_path": BASE,
                            "keep_bottom_n_layers": -1, "reinit_model": False},
        "noise_config": {"_target_": "noise_schedule_noise_schedules.StaggeredNoise", "eps": 1e-3,
                         "block_size": LENGTH, "desired_block_size": SET_SIZE, "max_block_size": LENGTH,
                         "length": LENGTH},
        "tokenization_config": {"vocab_size": QWEN_VOCAB, "mask_token_id": MASK, "pad_token_id": ENDOFTEXT,
                                "bos_token_id": ENDOFTEXT, "eos_token_id": ENDOFTEXT, "pad_vocab_size_multiple": 1},
        "tokenizer_name": BASE, "keep_clean_bos": False, "setdlm_eos_last_in_target_order": False,
        "setdlm_fht_cache_order": False,
    }


def _static_mask() -> torch.Tensor:
    return torch.ones(16, 16, dtype=torch.bool).tril()  # stands in for the 2L x 2L buffer (same name, smaller)


def write_release(layout: str, state: dict[str, torch.Tensor], folder: Path) -> Path:
    """`state` (Qwen3ForCausalLM names) saved as the reference saves it; returns what to import."""
    folder.mkdir(parents=True, exist_ok=True)
    if layout == "composer":  # a Composer run folder: config.yaml + checkpoints/*.pt, no tokenizer
        sd = {f"model.backbone._orig_mod.model.{k}": v for k, v in state.items()}
        sd["model.static_attention_mask"] = _static_mask()
        (folder / "checkpoints").mkdir(exist_ok=True)
        torch.save({"state": {"model": sd, "optimizers": {}, "timestamp": {"epoch": 1, "batch": 100}},
                    "rng": [{"torch": torch.get_rng_state()}]}, folder / "checkpoints" / "best-rank0.pt")
        torch.save({"state": {"model": sd}}, folder / "checkpoints" / "ep0-ba50-rank0.pt")
        (folder / "config.yaml").write_text(yaml.safe_dump({"model": {"_target_": "src.denoiser.diffusion.SetDLM",
                                                                      "config": reference_config()},
                                                            "training": {"lr": 3e-4}}))
        return folder
    prefix = "backbone._orig_mod.model." if layout == "compiled" else "backbone.model."
    sd = {prefix + k: v for k, v in state.items()}
    sd["static_attention_mask"] = _static_mask()
    if layout == "hf_safetensors":
        save_file({k: v.clone().contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    else:
        torch.save(sd, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(reference_config()))
    (folder / "tokenizer.json").write_text(qwen_tokenizer_json())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "bos_token": None,
                                                              "pad_token": "<|endoftext|>"}))
    return folder


def tokenizer_file(folder: Path) -> Path:
    path = folder / "qwen-tokenizer.json"
    path.write_text(qwen_tokenizer_json())
    return path
