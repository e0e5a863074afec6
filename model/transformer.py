"""SetDLM: a Qwen3-style decoder (RMSNorm, RoPE on explicit positions, GQA with per-head q/k
RMSNorm, SwiGLU, tied embeddings) whose behaviour as a set-diffusion model lives entirely in the
boolean mask and the position ids it is given.

The model holds no session state.  With a KVCache, `forward` writes the new tokens' K/V into
the cache's scratch slots past its valid length (no copy of the cached slots) and the caller
commits the first m of them with `cache.commit`; without one it can return them.  Parameter
names follow the Qwen3 layout so Qwen3-backbone checkpoints load by stripping prefixes.  Its
linear layers give a token's row the same bits whatever the number of rows beside it
(model/linear.py: a kernel that reduces in one order; where it is absent, a short forward is
padded once to its layers' largest minimum), so a sequence alone and in a batch round alike.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model import rowdot
from model.attention import additive, attention
from model.config import ModelConfig
from model.linear import Linear, fused, least_rows


class Keys(Protocol):
    """Where a forward's keys and values come from besides its own tokens: a KVCache (one
    sequence) or a BatchKV (model/batch.py: B sequences in a KV pool)."""

    def reserve(self, n: int) -> None: ...

    def mask_shape(self, n: int) -> tuple[int, int] | None:
        """(T, S) of the mask a forward of n new tokens takes: its queries and the keys they
        attend over (the cached slots, then the new ones); None: the keys hold their own masks."""
        ...

    def attend(self, i: int, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Layer i: write the new tokens' k, v (1, n, Hkv, D) to the scratch slots and attend
        their queries q (1, n, H, D) over every key they see, under mask (additive, of
        mask_shape(n), or None for the keys' own); returns (1, n, H * D)."""
        ...


class NewKV(NamedTuple):
    k: Tensor  # (n_layers, B, T, n_kv_heads, head_dim), post-RoPE
    v: Tensor  # (n_layers, B, T, n_kv_heads, head_dim)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # normalised in fp32 and cast back before the weight, as Qwen3 does (matters in bf16):
        # x * rsqrt(mean(x^2) + eps); on the CPU kernel each row in one order (model/pointwise.c)
        y = rowdot.norm(x, self.weight, self.eps, torch.get_num_threads())
        return y if y is not None else self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


def rope_table(cfg: ModelConfig) -> tuple[Tensor, Tensor]:
    """cos, sin tables: each (max_seq_len, head_dim // 2), indexed by position id.  Computed in
    fp32 exactly as HF Qwen3 computes its angles, so imported checkpoints agree at long positions."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim))
    ang = torch.arange(cfg.max_seq_len, dtype=torch.int64).float()[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def rope_rows(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin (B, T, D/2) gathered at the tokens' positions -> (cos | cos), (-sin | sin), each
    (B, T, 1, D): what apply_rope multiplies a head by, built once per forward."""
    return torch.cat([cos, cos], -1)[:, :, None, :], torch.cat([-sin, sin], -1)[:, :, None, :]


def apply_rope(x: Tensor, cs: tuple[Tensor, Tensor]) -> Tensor:
    """x: (B, T, H, D); cs: rope_rows(cos, sin).  Rotates the two halves of each head (the
    Qwen/Llama "rotate_half" convention): (x1 c - x2 s | x2 c + x1 s), as x (c | c) + (x2 |
    x1) (-s | s) (the same roundings: a - b is a + (-b))."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, T, H, D/2) each
    return x * cs[0] + torch.cat([x2, x1], dim=-1) * cs[1]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = Linear(cfg.d_model, H * D, bias=False)
        self.k_proj = Linear(cfg.d_model, Hkv * D, bias=False)
        self.v_proj = Linear(cfg.d_model, Hkv * D, bias=False)
        self.o_proj = Linear(H * D, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(D, cfg.rms_eps)  # per-head, over head_dim (Qwen3)
        self.k_norm = RMSNorm(D, cfg.rms_eps)

    def forward(self, x: Tensor, cs: tuple[Tensor, Tensor], mask: Tensor | None,
                cache: Keys | None, i: int) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, P, d_model), P >= T: the T tokens (cs: their rope_rows, (B, T, 1, D) each), then rows that only pad the
        products (they attend nowhere: zeros to the output projection); mask: (B|1, T, S)
        additive (0 or -inf) of cache.mask_shape(T), or None for a cache's own; i: layer index.
        With a cache this call's K/V go to its scratch slots and the keys are [cached slots |
        these tokens]: a KVCache (one sequence) or a model/batch.py BatchKV (B sequences of a KV
        pool, packed into T tokens).  Returns the output (B, P, d_model) and this call's k, v:
        (B, T, Hkv, D), post-RoPE."""
        B, P, _ = x.shape
        T = cs[0].shape[1]  # the tokens; rows T..P-1 of x, if any, pad the products (SetDLM.forward)
        cfg = self.cfg
        q, k, v = fused(x, self.q_proj, self.k_proj, self.v_proj)
        v = v[:, :T].view(B, T, cfg.n_kv_heads, cfg.head_dim)
        qk = self._norm_rope(q[:, :T], k[:, :T], cs)
        if qk is None:
            q = self.q_norm(q[:, :T].view(B, T, cfg.n_heads, cfg.head_dim))  # (B, T, H, D)
            k = self.k_norm(k[:, :T].view(B, T, cfg.n_kv_heads, cfg.head_dim))  # (B, T, Hkv, D)
            qk = apply_rope(q, cs), apply_rope(k, cs)
        q, k = qk
        if cache is not None:
            out = cache.attend(i, q, k, v, mask)  # (B, T, H * D)
        else:
            assert mask is not None, "a forward without a cache takes a mask"
            out = attention(q, k, v, mask)
        if P > T:
            out = F.pad(out, (0, 0, 0, P - T))  # (B, P, H * D)
        return self.o_proj(out), k, v

    def _norm_rope(self, q: Tensor, k: Tensor, cs: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor] | None:
        """q (B, T, H * D), k (B, T, Hkv * D) -> their heads' RMSNorms then RoPE, (B, T, H, D) and
        (B, T, Hkv, D), in one pass of model/pointwise.c (its rounding for apply_rope's; the
        norms in its one order); None where it does not run them (q_norm, apply_rope then do)."""
        if self.q_norm.eps != self.k_norm.eps:
            return None
        h = self.cfg.head_dim // 2
        return rowdot.norm_rope(q, k, self.q_norm.weight, self.k_norm.weight, cs[0][:, :, 0, :h], cs[1][:, :, 0, h:],
                                self.q_norm.eps, torch.get_num_threads())


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = fused(x, self.gate_proj, self.up_proj)
        return self.down_proj(F.silu(gate) * up)


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cs: tuple[Tensor, Tensor], mask: Tensor | None,
                cache: Keys | None, i: int) -> tuple[Tensor, Tensor, Tensor]:
        h, k, v = self.self_attn(self.input_layernorm(x), cs, mask, cache, i)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class SetDLM(nn.Module):
    rope_cos: Tensor  # (max_seq_len, head_dim // 2) buffers, indexed by position id
    rope_sin: Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        #: the linear layers' (in, out) shapes: each has its own least row-invariant product
        self.shapes = tuple(sorted({(m.in_features, m.out_features) for m in self.modules() if isinstance(m, Linear)}))
        cos, sin = rope_table(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_seq_len, D/2)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: Tensor, pos: Tensor, mask: Tensor | None, cache: Keys | None = None,
                return_kv: bool = False, logits_at: Tensor | slice | None = None) -> tuple[Tensor, NewKV | None]:
        """ids, pos: (B, T) long (or (T,), taken as B = 1); mask: (T, S) or (B, T, S) bool, True =
        attend, of cache.mask_shape(T) (keys are [cache slots | these tokens]; (T, T) without a
        cache), or None with a cache that holds its own (a BatchKV: B sequences packed into one
        row of T tokens).  Returns logits (B, T, vocab), and with return_kv the K/V of these T
        tokens.  With a cache, their K/V land in its scratch slots: `cache.commit` keeps the
        first m of them; the valid slots are never touched.  logits_at: the tokens (an index or
        a slice of dim 1) whose logits are wanted, e.g. a step's masks (not its pending set, nor
        a prefill's tokens); the logits are then (B, selected, vocab)."""
        if ids.dim() == 1:
            ids, pos = ids[None], pos[None]
        B, T = ids.shape
        shape = cache.mask_shape(T) if cache is not None else (T, T)
        assert (mask is None) == (shape is None), "a mask exactly when the keys hold none of their own"
        if cache is not None:
            cache.reserve(T)
        x = self.embed_tokens(ids)  # (B, T, d_model)
        if B == 1 and x.device.type == "cpu":  # every product row-invariant (model/linear.py): 1 with the kernel
            least = least_rows(self.shapes, x.dtype, torch.get_num_threads())
            if least is not None and T < least:
                x = F.pad(x, (0, 0, 0, least - T))  # (1, P, d_model): zero rows after the tokens
        if mask is not None:
            assert mask.shape[-2:] == shape, f"mask {tuple(mask.shape)} != {shape}"
            # additive, built once for all layers: attention with a float mask is ~30% faster on
            # CPU than with a boolean one (every row keeps at least one key: no row is all -inf)
            mask = additive(mask if mask.dim() == 3 else mask[None], x.dtype, x.device)  # (B|1, T, S)
        # gathered once for all layers, in the activations' dtype (as HF casts cos/sin)
        cs = rope_rows(self.rope_cos[pos].to(x.dtype), self.rope_sin[pos].to(x.dtype))  # (B, T, 1, D) each
        ks, vs = [], []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, cs, mask, cache, i)
            if return_kv:
                ks.append(k)
                vs.append(v)
        kv = NewKV(torch.stack(ks), torch.stack(vs)) if return_kv else None
        if x.shape[1] > T:
            x = x[:, :T]  # the padding dropped
        if logits_at is not None:
            x = x[:, logits_at]  # (B, selected, d_model): the vocabulary projection is per token
        return self.lm_head(self.norm(x)), kv
