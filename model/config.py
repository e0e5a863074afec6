"""ModelConfig: the shape of a set-diffusion transformer and its special token ids.

Knows nothing about tokenisation beyond the fixed ids of the special tokens (the tokenizer puts
them first, in this order), and nothing about sessions or storage.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

# Special tokens occupy the first ids of every vocabulary, in this order (see tokenizer.py).
SPECIAL_TOKENS = ("[PAD]", "[MASK]", "[BOS]", "[EOS]")
PAD_ID, MASK_ID, BOS_ID, EOS_ID = range(len(SPECIAL_TOKENS))


@dataclass
class ModelConfig:
    name: str = "custom"
    vocab_size: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2  # grouped-query attention: n_heads % n_kv_heads == 0
    head_dim: int = 0  # 0 => d_model // n_heads
    d_ff: int = 128  # SwiGLU hidden width
    max_seq_len: int = 256  # positions 0 .. max_seq_len-1; the session overflow limit
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = True
    set_size: int = 2  # d: desired set size of the training order sampler
    max_set_size: int = 0  # smax; 0 => 2 * set_size (the paper's default)
    pad_id: int = PAD_ID
    mask_id: int = MASK_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.d_model // self.n_heads
        if self.max_set_size == 0:
            self.max_set_size = 2 * self.set_size
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if not 1 <= self.set_size <= self.max_set_size:
            raise ValueError(f"need 1 <= set_size ({self.set_size}) <= max_set_size ({self.max_set_size})")
        if self.vocab_size <= max(self.pad_id, self.mask_id, self.bos_id, self.eos_id):
            raise ValueError("vocab_size must leave room for the special tokens")

    @classmethod
    def from_name(cls, name: str, **overrides: object) -> ModelConfig:
        if name not in PRESETS:
            raise KeyError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], "name": name, **overrides})  # type: ignore[arg-type]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**data)


PRESETS: dict[str, dict[str, object]] = {
    # random tiny model used by the tests: fast on one CPU thread
    "test": dict(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                 max_seq_len=256, set_size=2),
    # the toy model the decode benchmark trains in seconds (arithmetic progressions)
    "toy": dict(vocab_size=64, d_model=96, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=256,
                max_seq_len=512, set_size=4),
    # the shipped model (model/shipped/, `setflow train --preset small`): sized so that it trains
    # in about an hour on a 2-core CPU (1M parameters; see docs/BENCHMARKS.md)
    "small": dict(vocab_size=896, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=512,
                  max_seq_len=1024, set_size=4),
}
