"""ModelConfig: the shape of a set-diffusion transformer and its special token ids.

Knows nothing about tokenisation beyond the ids of the special tokens (setflow's own vocabularies
put them first, in the order below; an imported model's ids come from its files), and nothing
about sessions or storage.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields

from domain.markup import SPECIAL_TOKENS

# setflow's own vocabularies (tokenizer.py's `train`) put these first, in this order; these ids are
# ModelConfig's defaults, never assumed elsewhere: code reads cfg.*_id or the tokenizer's ids.
PAD_ID, MASK_ID, BOS_ID, EOS_ID = range(len(SPECIAL_TOKENS))
SAME_AS_BOS = -1  # doc_start_id's default: the BOS token starts a document (setflow's own models)


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
    # the token whose key starts a new document (per-document masking, masks.within_documents);
    # None: no document boundaries (Qwen's BOS is its EOS: every EOS would start a document)
    doc_start_id: int | None = SAME_AS_BOS

    def __post_init__(self) -> None:
        if self.doc_start_id == SAME_AS_BOS:
            self.doc_start_id = self.bos_id
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
        specials = [self.pad_id, self.mask_id, self.bos_id, self.eos_id]
        if self.doc_start_id is not None:
            specials.append(self.doc_start_id)
        if not all(0 <= i < self.vocab_size for i in specials):
            raise ValueError(f"special ids {specials} must lie in the vocabulary [0, {self.vocab_size})")
        if self.mask_id in (self.pad_id, self.bos_id, self.eos_id, self.doc_start_id):
            raise ValueError(f"mask_id {self.mask_id} must be a token of its own")

    @property
    def special_ids(self) -> frozenset[int]:
        """Every special id (pad, mask, bos, eos, document start): what decoding may skip."""
        ids = {self.pad_id, self.mask_id, self.bos_id, self.eos_id}
        return frozenset(ids if self.doc_start_id is None else ids | {self.doc_start_id})

    def valid_ids(self, ids: Iterable[object], holes: bool = False) -> bool:
        """The one token-id check: every id is an int in [0, vocab_size), and none is the mask
        id unless holes (an infill's input holds mask_id at its holes).  Each caller raises its
        own error (the decoder's DecodeError, the runtime's BadInput)."""
        return all(isinstance(t, int) and 0 <= t < self.vocab_size and (holes or t != self.mask_id) for t in ids)

    @classmethod
    def from_name(cls, name: str, **overrides: object) -> ModelConfig:
        if name not in PRESETS:
            raise KeyError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], "name": name, **overrides})  # type: ignore[arg-type]

    def to_json(self) -> str:
        data = asdict(self)
        if data["doc_start_id"] == data["bos_id"]:
            # the default meaning is left out: a config written before the field existed keeps
            # its text, and with it the fingerprint its KV blobs carry
            del data["doc_start_id"]
        return json.dumps(data, sort_keys=True)

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
                  max_seq_len=2048, set_size=4),
}
