"""The Qwen3-style decoder: parameter layout, shapes, batch consistency, RoPE on positions."""

import pytest
import torch

from model.config import ModelConfig
from model.masks import step_mask
from model.transformer import SetDLM


def test_parameter_names_follow_the_qwen3_layout(model: SetDLM) -> None:
    names = set(model.state_dict())
    for i in range(model.cfg.n_layers):
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj",
                     "mlp.down_proj", "input_layernorm", "post_attention_layernorm"):
            assert f"layers.{i}.{part}.weight" in names
    assert {"embed_tokens.weight", "norm.weight", "lm_head.weight"} <= names
    assert not any("rope" in n for n in names), "RoPE tables are not weights"
    cfg = model.cfg
    assert model.layers[0].self_attn.k_proj.weight.shape == (cfg.n_kv_heads * cfg.head_dim, cfg.d_model)
    assert model.lm_head.weight is model.embed_tokens.weight, "tied embeddings"


@torch.no_grad()
def test_batch_rows_are_independent(model: SetDLM) -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 64, (3, 10), generator=g)
    pos = torch.arange(10).expand(3, 10)
    mask = step_mask(0, 10, 0)
    logits, kv = model(ids, pos, mask, return_kv=True)
    assert kv is not None and logits.shape == (3, 10, 64) and kv.k.shape == (2, 3, 10, 2, 16)
    for b in range(3):
        one, _ = model(ids[b], pos[b], mask)
        torch.testing.assert_close(one[0], logits[b], atol=1e-5, rtol=0)


@torch.no_grad()
def test_scores_depend_on_positions_not_slot_order(model: SetDLM) -> None:
    """Two keys listed in either order give the same output for a query that sees both (each key
    sees only itself, so its K/V do not depend on the listing either)."""
    M = model.cfg.mask_id
    mask = torch.tensor([[True, False, False], [False, True, False], [True, True, True]])
    a, _ = model(torch.tensor([7, 9, M]), torch.tensor([0, 1, 2]), mask)
    b, _ = model(torch.tensor([9, 7, M]), torch.tensor([1, 0, 2]), mask)
    torch.testing.assert_close(a[0, 2], b[0, 2], atol=1e-5, rtol=0)
    c, _ = model(torch.tensor([9, 7, M]), torch.tensor([0, 1, 2]), mask)
    assert not torch.allclose(a[0, 2], c[0, 2], atol=1e-3), "positions matter"


def test_config_presets_and_validation() -> None:
    cfg = ModelConfig.from_name("test")
    assert cfg.head_dim == 16 and cfg.max_set_size == 2 * cfg.set_size
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    for bad in ({"n_kv_heads": 3}, {"set_size": 0}, {"vocab_size": 3}):
        with pytest.raises(ValueError):
            ModelConfig.from_name("test", **bad)
    with pytest.raises(KeyError, match="test"):
        ModelConfig.from_name("huge")
