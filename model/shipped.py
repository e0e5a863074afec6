"""The shipped checkpoint: where it lies in the repository and how to load it with its tokenizer.

`model/shipped/` holds `model.safetensors`, `config.json` and `tokenizer.json` of the `small`
preset, trained by `setflow train --preset small` on the corpora in domain/ (the command
and its wall time: docs/BENCHMARKS.md).  It is what the runtime loads by default.
"""

from __future__ import annotations

from pathlib import Path

import torch

from model import checkpoint
from model.tokenizer import SpecialIds, Tokenizer
from model.transformer import SetDLM

SHIPPED = Path(__file__).resolve().parent / "shipped"


def load(folder: str | Path = SHIPPED, device: str | torch.device = "cpu",
         dtype: torch.dtype = torch.float32) -> tuple[SetDLM, Tokenizer]:
    """The model (in eval mode) and its tokenizer from a checkpoint folder that holds both."""
    folder = Path(folder)
    if not (folder / checkpoint.TOKENIZER).is_file():
        raise FileNotFoundError(f"{folder} holds no {checkpoint.TOKENIZER}: not a shippable checkpoint")
    model = checkpoint.load(folder, device=device, dtype=dtype)
    # the special ids are the model's (its config.json), never assumed from the vocabulary
    tok = Tokenizer.from_file(folder / checkpoint.TOKENIZER, SpecialIds.of(model.cfg))
    if tok.vocab_size > model.cfg.vocab_size:
        raise ValueError(f"{folder}: tokenizer has {tok.vocab_size} tokens > the model's {model.cfg.vocab_size}")
    return model, tok
