"""The toy corpus: deterministic, self-consistent, and resumable by step."""

from itertools import islice

from model.config import BOS_ID, EOS_ID
from model.corpus import toy


def test_examples_are_deterministic_and_pass_their_checker() -> None:
    a = list(islice(toy.examples(3), 50))
    assert a == list(islice(toy.examples(3), 50))
    assert a != list(islice(toy.examples(4), 50))
    for ids, n in a:
        assert ids[0] == BOS_ID and ids[-1] == EOS_ID and n == toy.PROMPT_LEN
        assert toy.check(ids[:n], ids[n:])


def test_checker_refuses_a_wrong_term_and_an_empty_answer() -> None:
    ids, n = next(toy.examples(0))
    wrong = ids[n:]
    wrong[2] = toy.FIRST + (wrong[2] - toy.FIRST + 1) % toy.MOD
    assert not toy.check(ids[:n], wrong)
    assert not toy.check(ids[:n], [EOS_ID]) and not toy.check(ids[:n], [])


def test_batches_depend_only_on_the_step() -> None:
    make = toy.batches(seed=1, batch_size=4, seq_len=16)
    straight = list(islice(make(0), 6))
    resumed = list(islice(make(4), 2))
    assert resumed == straight[4:6]
    assert all(len(ids) <= 16 for batch in straight for ids, _ in batch)
