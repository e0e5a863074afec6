"""Tests for model/tokenizer.py: special ids, markup, round trips, determinism, persistence."""

from __future__ import annotations

import itertools

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from domain.markup import SPECIAL_TOKENS
from model.config import BOS_ID, EOS_ID, MASK_ID, PAD_ID
from model.tokenizer import MARKUP_TOKENS, Tokenizer

VOCAB = 400


def _corpus() -> list[str]:
    metrics = ["revenue", "margin", "headcount", "churn", "costs"]
    verbs = ["rose", "fell", "grew", "dropped"]
    regions = ["EMEA", "APAC", "LATAM", "NA"]
    lines = []
    for i, (m, v, r) in enumerate(itertools.product(metrics, verbs, regions)):
        pct, amount = 3 + i % 40, 900 + 37 * i
        lines.append(f"{m} {v} {pct}% to {amount:,} in {r}")
        lines.append(f'<call>calc("({amount}-950)/950*100")</call><result>{pct}.5</result>')
        lines.append(f"<section>{r} {m}</section> the {m} <hole> in Q{1 + i % 4}")
    return lines


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return _corpus()


@pytest.fixture(scope="module")
def tok(corpus: list[str]) -> Tokenizer:
    return Tokenizer.train(corpus, VOCAB)


def test_special_ids_in_order(tok: Tokenizer) -> None:
    assert [tok.token_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert (tok.pad_id, tok.mask_id, tok.bos_id, tok.eos_id) == (PAD_ID, MASK_ID, BOS_ID, EOS_ID)
    assert [tok.token_id(t) for t in MARKUP_TOKENS] == list(range(4, 4 + len(MARKUP_TOKENS)))
    assert 4 + len(MARKUP_TOKENS) < tok.vocab_size <= VOCAB


def test_markup_tokens_are_single_ids(tok: Tokenizer) -> None:
    for t in MARKUP_TOKENS:
        assert tok.encode(t) == [tok.token_id(t)]
    ids = tok.encode("x<call>y</call>z")
    assert tok.token_id("<call>") in ids and tok.token_id("</call>") in ids


def test_no_bos_eos_added(tok: Tokenizer) -> None:
    ids = tok.encode("revenue rose")
    assert ids and BOS_ID not in ids and EOS_ID not in ids
    assert tok.encode("") == []


@pytest.mark.parametrize(
    "text",
    [
        "revenue rose 12% to 1,250 in EMEA",
        "  leading and trailing spaces \n\ttabs\n",
        "café — 5 €, 日本語, emoji 🙂",
        '<call>calc("(1200-950)/950*100")</call> <result>26.3</result>',
        "<section>EMEA</section>\n<hole> and <hole><hole>",
        "words never seen: zyxwvut qqq",
        "",
    ],
)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_skip_special(tok: Tokenizer) -> None:
    body = tok.encode("<call>f(1)</call> done")
    ids = [BOS_ID, *body, EOS_ID, PAD_ID, MASK_ID]
    assert tok.decode(ids, skip_special=True) == "<call>f(1)</call> done"
    assert tok.decode(ids) == "[BOS]<call>f(1)</call> done[EOS][PAD][MASK]"


def test_training_is_deterministic(tok: Tokenizer, corpus: list[str]) -> None:
    assert Tokenizer.train(corpus, VOCAB).to_str() == tok.to_str()


def test_names_are_spelled_with_the_same_ids_wherever_they_stand(tok: Tokenizer) -> None:
    """spell_capitals: a capital letter is always a token of its own, so a name is the same
    letters in a question and in a tool call, and the model copies it letter by letter."""
    emea = tok.encode("EMEA")
    assert [tok.decode([i]) for i in emea] == ["E", "M", "E", "A"]
    for text in ("margin fell in EMEA", 'f("EMEA")', "EMEA rose"):
        ids = tok.encode(text)
        assert any(ids[i:i + 4] == emea for i in range(len(ids))), text
        assert tok.decode(ids) == text
    assert all(not any("A" <= c <= "Z" for c in tok.decode([i])) or len(tok.decode([i])) == 1
               for i in range(len(SPECIAL_TOKENS) + len(MARKUP_TOKENS), tok.vocab_size))
    plain = Tokenizer.train(_corpus(), VOCAB, spell_capitals=False)
    assert len(plain.encode("EMEA")) < 4  # merged: " EMEA" and "EMEA" would be unrelated ids


def test_save_and_load(tok: Tokenizer, tmp_path) -> None:
    text = "margin fell 7% to 2,011 in APAC <call>calc(\"1+1\")</call> café"
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    for other in (Tokenizer.from_file(path), Tokenizer.from_str(tok.to_str())):
        assert other.encode(text) == tok.encode(text)
        assert other.to_str() == tok.to_str()
        assert other.vocab_size == tok.vocab_size


def test_unknown_token_raises(tok: Tokenizer) -> None:
    with pytest.raises(KeyError, match="not in the vocabulary"):
        tok.token_id("<no-such-token>")


def _raw_bpe_json(specials: list[str], corpus: list[str]) -> str:
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False)
    hf.train_from_iterator(corpus, trainer=trainer)
    return hf.to_str()


def test_wrong_special_order_refused(corpus: list[str]) -> None:
    specials = ["[MASK]", "[PAD]", "[BOS]", "[EOS]", *MARKUP_TOKENS]
    with pytest.raises(ValueError, match=r"'\[PAD\]' has id 1, expected 0"):
        Tokenizer.from_str(_raw_bpe_json(specials, corpus))


def test_missing_markup_refused(corpus: list[str]) -> None:
    with pytest.raises(ValueError, match="markup tokens missing"):
        Tokenizer.from_str(_raw_bpe_json(list(SPECIAL_TOKENS), corpus))


def test_any_tokenizer_json_with_the_models_special_ids() -> None:
    """A Qwen-style vocabulary: specials past 151k, BOS = EOS; ids 0-3 are ordinary bytes
    (!"#$ in Qwen's) and survive skip_special, only the model's special ids are dropped."""
    from model.tokenizer import SpecialIds
    from tests.model.released import ENDOFTEXT, MASK, qwen_tokenizer_json

    tok = Tokenizer.from_str(qwen_tokenizer_json(), SpecialIds(ENDOFTEXT, MASK, ENDOFTEXT, ENDOFTEXT, None))
    assert (tok.pad_id, tok.mask_id, tok.bos_id, tok.eos_id, tok.doc_start_id) == (ENDOFTEXT, MASK, ENDOFTEXT,
                                                                                   ENDOFTEXT, None)
    text = '!"#$ the theory'
    ids = tok.encode(text)
    assert ids[:4] == [0, 1, 2, 3]
    assert tok.decode([ENDOFTEXT, *ids, MASK, ENDOFTEXT], skip_special=True) == text
    assert tok.decode(ids + [ENDOFTEXT]) == text + "<|endoftext|>"
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        Tokenizer.from_str(qwen_tokenizer_json(), SpecialIds(0, 160_000, 1, 2, None))
