"""Synthetic released checkpoints for the tests: tiny random Qwen3 weights written in each layout
the reference (kuleshov-group/setdlms) saves.  The writer is bench/checkpoints.py's, the one that
writes the realistic shapes too; this module names what the tests use of it, at the tiny shape."""

from __future__ import annotations

from bench.checkpoints import (
    BASE,
    ENDOFTEXT,
    IM_END,
    IM_START,
    LAYOUTS,
    LENGTH,
    MASK,
    QWEN_BPE,
    QWEN_SPECIALS,
    QWEN_VOCAB,
    SET_SIZE,
    SHAPES,
    qwen3_state,
    qwen_tokenizer_json,
    reference_config,
    tokenizer_file,
    write_release,
)

SHAPE = SHAPES["tiny"]  # the tiny shape every test model has

__all__ = ["BASE", "ENDOFTEXT", "IM_END", "IM_START", "LAYOUTS", "LENGTH", "MASK", "QWEN_BPE", "QWEN_SPECIALS",
           "QWEN_VOCAB", "SET_SIZE", "SHAPE", "qwen3_state", "qwen_tokenizer_json", "reference_config",
           "tokenizer_file", "write_release"]
