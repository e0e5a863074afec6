"""Toy corpus for the `toy` preset: arithmetic progressions mod 60 over the number tokens 4..63.
An example is the prompt [BOS, a, a+s, a+2s] then the next n terms and EOS; deterministic by seed."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from itertools import count

from model.config import BOS_ID, EOS_ID
from model.train import Example

FIRST, MOD = 4, 60  # token FIRST + v is the number v, for v in 0..MOD-1
PROMPT_LEN = 4
DIFFS = range(1, 6)  # small common differences: "x -> x + s" is a table learnt in seconds
# Far longer than a 64-token training window: most examples are cropped before their EOS, so the
# model learns that a progression may go on (the benchmark decodes up to 256 terms).
N_TERMS = (20, 300)
# what learns this corpus well (greedy AR passes `check`) in ~250 steps: TrainConfig keywords
RECIPE = dict(batch_size=32, seq_len=64, lr=1e-2, warmup=20)


def progression(a: int, s: int, n: int) -> list[int]:
    return [FIRST + (a + i * s) % MOD for i in range(n)]


def _example(rng: random.Random) -> Example:
    a, s, n = rng.randrange(MOD), rng.choice(DIFFS), rng.randint(*N_TERMS)
    return [BOS_ID, *progression(a, s, 3 + n), EOS_ID], PROMPT_LEN


def examples(seed: int) -> Iterator[Example]:
    """Infinite stream of uncropped examples."""
    rng = random.Random(seed)
    while True:
        yield _example(rng)


def batches(seed: int, batch_size: int, seq_len: int = 64) -> Callable[[int], Iterator[list[Example]]]:
    """`train()`'s data: batch s is drawn from its own RNG seeded by (seed, s), so a resumed run
    sees the same batches.  Examples are cropped to seq_len."""
    def from_step(start: int) -> Iterator[list[Example]]:
        for s in count(start):
            rng = random.Random(f"toy/{seed}/{s}")  # str seeds hash deterministically (sha512)
            yield [(ids[:seq_len], n) for ids, n in (_example(rng) for _ in range(batch_size))]
    return from_step


def check(prompt: list[int], generated: list[int]) -> bool:
    """generated is at least one term that continues prompt's progression, up to its EOS (or to
    the end when decoding hit its length limit)."""
    step = (prompt[-1] - prompt[-2]) % MOD
    expect = prompt[-1] - FIRST
    for i, tok in enumerate(generated):
        if tok == EOS_ID:
            return i > 0
        expect = (expect + step) % MOD
        if tok != FIRST + expect:
            return False
    return bool(generated)
