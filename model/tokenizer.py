"""Tokenizer: a thin wrapper over a HuggingFace `tokenizers` tokenizer.json.

Holds the vocabulary, the special ids and the workflow markup tokens; knows nothing about models.
setflow's own vocabularies (`train`) put [PAD] [MASK] [BOS] [EOS] at ids 0-3 and the markup right
after; any other tokenizer.json (an imported model's) is used with the special ids its model's
files name (`SpecialIds`), never assumed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from domain.markup import MARKUP_TOKENS, SPECIAL_TOKENS
from model.config import BOS_ID, EOS_ID, MASK_ID, PAD_ID, ModelConfig


@dataclass(frozen=True)
class SpecialIds:
    """The ids a model gives its special tokens; doc_start None: no document boundaries."""

    pad: int
    mask: int
    bos: int
    eos: int
    doc_start: int | None

    @classmethod
    def of(cls, cfg: ModelConfig) -> SpecialIds:
        return cls(cfg.pad_id, cfg.mask_id, cfg.bos_id, cfg.eos_id, cfg.doc_start_id)

    def all(self) -> frozenset[int]:
        ids = {self.pad, self.mask, self.bos, self.eos}
        return frozenset(ids if self.doc_start is None else ids | {self.doc_start})


SETFLOW_SPECIALS = SpecialIds(PAD_ID, MASK_ID, BOS_ID, EOS_ID, BOS_ID)


class Tokenizer:
    """Any str round-trips through a byte-level vocabulary.  specials: the model's special ids;
    None: setflow's own convention ([PAD] [MASK] [BOS] [EOS] at ids 0..3, the markup present),
    checked."""

    def __init__(self, hf: _HFTokenizer, specials: SpecialIds | None = None) -> None:
        self._hf = hf
        if specials is None:
            self._check()
            specials = SETFLOW_SPECIALS
        self.specials = specials
        self._special_set = specials.all()
        outside = sorted(i for i in self._special_set if not 0 <= i < self.vocab_size)
        if outside:
            raise ValueError(f"special ids {outside} are not in the tokenizer's vocabulary of {self.vocab_size}")

    def _check(self) -> None:
        for want, tok in enumerate(SPECIAL_TOKENS):
            got = self._hf.token_to_id(tok)
            if got != want:
                raise ValueError(
                    f"special token {tok!r} has id {got}, expected {want}: "
                    f"a vocabulary must start with {', '.join(SPECIAL_TOKENS)} in this order"
                )
        missing = [t for t in MARKUP_TOKENS if self._hf.token_to_id(t) is None]
        if missing:
            raise ValueError(f"markup tokens missing from the vocabulary: {missing}")

    # -- constructors ---------------------------------------------------------------------------

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, split_digits: bool = True,
              spell_capitals: bool = True) -> Tokenizer:
        """BPE learnt from `texts`.
        split_digits: every digit is its own token, so numbers are copied and compared digit by
        digit (a small model cannot learn a merge table of numbers).
        spell_capitals: no token holds a capital letter but the letter itself, so a name is
        spelled ("EMEA" -> E M E A, "Northwind" -> N orth wind) and copied letter by letter like
        a number.  As one token per name, interchangeable names (regions, tenants) are near
        twins to a small model: it put another region into 58 of 69 tool calls; spelled, the
        right one into 66 of 69 (probe 2 in docs/BENCHMARKS.md)."""
        hf = _HFTokenizer(models.BPE())
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                            if split_digits else byte_level)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[*SPECIAL_TOKENS, *MARKUP_TOKENS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        hf.train_from_iterator(texts, trainer=trainer)
        return cls(_without_capital_merges(hf) if spell_capitals else hf)

    def with_tokens(self, tokens: Iterable[str]) -> Tokenizer:
        """This vocabulary with `tokens` added after its last id, each one id that text never
        merges into (the fact slots: domain/markup.py SLOT_TOKENS); those it has already kept."""
        hf = _HFTokenizer.from_str(self._hf.to_str())
        hf.add_special_tokens([t for t in tokens if hf.token_to_id(t) is None])
        return type(self)(hf, self.specials)

    @classmethod
    def from_file(cls, path: str | Path, specials: SpecialIds | None = None) -> Tokenizer:
        return cls(_HFTokenizer.from_file(str(path)), specials)

    @classmethod
    def from_str(cls, json_text: str, specials: SpecialIds | None = None) -> Tokenizer:
        return cls(_HFTokenizer.from_str(json_text), specials)

    def to_str(self) -> str:
        """The tokenizer.json text."""
        return self._hf.to_str()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_str(), encoding="utf-8")

    # -- encoding -------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Ids of `text`; markup tokens become their single id, no BOS/EOS is added."""
        return self._hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """Inverse of encode; skip_special drops the special ids (pad, mask, bos, eos, document
        start) and nothing else: markup, and any other token, stays."""
        if skip_special:
            ids = [i for i in ids if i not in self._special_set]
        return self._hf.decode(list(ids), skip_special_tokens=False)

    # -- vocabulary -----------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return self.specials.pad

    @property
    def mask_id(self) -> int:
        return self.specials.mask

    @property
    def bos_id(self) -> int:
        return self.specials.bos

    @property
    def eos_id(self) -> int:
        return self.specials.eos

    @property
    def doc_start_id(self) -> int | None:
        return self.specials.doc_start

    def has_token(self, token: str) -> bool:
        return self._hf.token_to_id(token) is not None

    def token_id(self, token: str) -> int:
        i = self._hf.token_to_id(token)
        if i is None:
            raise KeyError(f"token {token!r} is not in the vocabulary ({self.vocab_size} tokens)")
        return i


def _has_capital(s: str) -> bool:
    return any("A" <= c <= "Z" for c in s)  # byte-level BPE keeps ASCII letters as themselves


def _without_capital_merges(hf: _HFTokenizer) -> _HFTokenizer:
    """The same BPE without any merge (or merged token) that holds a capital letter; the ids
    left are renumbered in order, so the special and markup tokens keep theirs.  A merge of
    lower-case pieces never passes through a dropped token, so other words split as before."""
    spec = json.loads(hf.to_str())
    bpe = spec["model"]
    fixed = {t["id"] for t in spec["added_tokens"]}
    kept = [t for t, i in sorted(bpe["vocab"].items(), key=lambda kv: kv[1])
            if i in fixed or len(t) == 1 or not _has_capital(t)]
    bpe["vocab"] = {t: i for i, t in enumerate(kept)}
    bpe["merges"] = [m for m in bpe["merges"] if not _has_capital("".join(m) if isinstance(m, list) else m)]
    if any(bpe["vocab"].get(t["content"]) != t["id"] for t in spec["added_tokens"]):
        raise AssertionError("special or markup ids moved")  # they are the first ids: cannot happen
    return _HFTokenizer.from_str(json.dumps(spec))
