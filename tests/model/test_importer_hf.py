"""The cross-check against Hugging Face transformers: random Qwen3 weights, written in each layout
the reference releases and imported, give Qwen3ForCausalLM's logits, and W = 1 decoding gives its
greedy tokens when the next token is read from a [MASK] query (SetDLM's rule: the query at
position p sees the clean prefix and itself, which is a causal forward over [prefix, MASK])."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model import shipped
from model.decode import generate
from model.importer import import_checkpoint
from model.masks import step_mask
from model.params import DecodeParams
from tests.model.released import LAYOUTS, MASK, QWEN_VOCAB, SHAPE, qwen3_state, tokenizer_file, write_release

transformers = pytest.importorskip("transformers")


def _hf_model(seed: int, tie: bool = True) -> tuple[object, dict[str, torch.Tensor]]:
    s = SHAPE
    cfg = transformers.Qwen3Config(vocab_size=QWEN_VOCAB, hidden_size=s["hidden"], intermediate_size=s["ff"],
                                   num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                                   num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"], rope_theta=1e6,
                                   rms_norm_eps=1e-6, tie_word_embeddings=tie, max_position_embeddings=512)
    cfg._attn_implementation = "eager"
    hf = transformers.Qwen3ForCausalLM(cfg).eval()
    state = qwen3_state(seed, tie=tie)
    hf.load_state_dict(state, strict=True)
    return hf, state


@torch.no_grad()
def _hf_greedy_from_mask_queries(hf: object, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        logits = hf(torch.tensor([ids + [MASK]])).logits[0, -1].float()  # type: ignore[operator]
        logits[MASK] = -torch.inf
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("layout", LAYOUTS)
@torch.no_grad()
def test_imported_layout_matches_hf_logits_and_greedy_tokens(layout: str, tmp_path: Path) -> None:
    hf, state = _hf_model(seed=3, tie=layout != "hf_safetensors")  # one layout with its own lm_head
    src = write_release(layout, state, tmp_path / "src")
    import_checkpoint(src, tmp_path / "out", tokenizer=tokenizer_file(tmp_path) if layout == "composer" else None)
    model, tok = shipped.load(tmp_path / "out")
    ids = tok.encode("the theory: in other terms, 12 + 30 = 42.")
    ids = ids + torch.randint(0, 151_000, (64 - len(ids),), generator=torch.Generator().manual_seed(0)).tolist()
    T = len(ids)
    want = hf(torch.tensor([ids])).logits[0]  # type: ignore[operator]
    got, _ = model(torch.tensor(ids), torch.arange(T), step_mask(0, T, 0))  # a causal prefill: (1, T, V)
    assert (got[0] - want).abs().max().item() < 1e-4
    prompt = ids[:12]
    tokens, _, _ = generate(model, prompt, DecodeParams(policy="ar", max_new_tokens=16, ignore_eos=True))
    assert tokens == _hf_greedy_from_mask_queries(hf, prompt, 16)
