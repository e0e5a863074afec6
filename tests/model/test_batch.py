"""model/batch.py: many sequences in one forward decode exactly what each decodes alone.

Each case runs the same turns twice: every sequence alone (KVCache, decode()), and all of them
through step_batch over one KV pool, with sessions of different lengths, windows, policies and
stop points in one batch, sequences joining and leaving mid-batch, an infill beside plain turns,
and second turns.  Tokens and ledgers must be identical; logits too, bit for bit, where each
sequence attends alone and the machine's products are row-invariant once padded (a CPU:
model/linear.py), else to float tolerance."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest
import torch

from model import batch
from model.attention import additive
from model.batch import BatchKV, batch_mask, step_batch
from model.decode import Commit, advance, begin_infill_turn, begin_turn, commit_pending, decode, plan, prefill
from model.kv_cache import KVCache
from model.linear import Linear, min_rows
from model.masks import step_mask, within_documents
from model.params import DecodeParams, DecodeState
from model.pool import BLOCK, KVPool, PooledCache
from model.transformer import SetDLM
from tests.fakes import random_params

ATOL = 1e-4


@pytest.fixture(params=["alone", "grouped"])
def attend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a batch attends: each sequence alone (on a CPU) and the padded groups (on a
    GPU, model/batch.py ALONE_ON), the latter run here on the CPU."""
    if request.param == "grouped":
        monkeypatch.setattr("model.batch.ALONE_ON", ())
    return str(request.param)


@dataclass
class Turn:
    ids: list[int]
    params: DecodeParams
    infill: bool = False


@dataclass
class Run:
    """One sequence's decode: its turns, and per turn its final tokens and step logits."""

    turns: list[Turn]
    join: int = 0  # the batch step at which it joins (its first turn opens then)
    tokens: list[list[int]] = field(default_factory=list)
    logits: list[list[torch.Tensor]] = field(default_factory=list)
    ledger: list[tuple[int, int]] = field(default_factory=list)


def _open(model: SetDLM, cache: KVCache, state: DecodeState | None, t: Turn, commit: Commit | None = None) -> DecodeState:
    if t.infill:
        return begin_infill_turn(model, cache, state, t.ids, t.params)
    return begin_turn(model, cache, state, t.ids, t.params, commit)


def alone(model: SetDLM, run: Run) -> Run:
    out = Run(run.turns, run.join)
    w = next(model.parameters())
    cache, state = KVCache.for_model(model.cfg, dtype=w.dtype, device=w.device), None
    for t in run.turns:
        state = _open(model, cache, state, t)
        out.logits.append([ev.logits for ev in decode(model, cache, state, t.params)])
        commit_pending(model, cache, state)
        out.tokens.append(list(state.tokens))
    out.ledger = list(zip(cache.positions, cache.tokens))
    return out


def contexts(model: SetDLM, n: int) -> int:
    """The blocks of n whole contexts."""
    return n * -(-model.cfg.max_seq_len // BLOCK)


def batched(model: SetDLM, runs: list[Run], blocks: int | None = None, in_batch: bool = False) -> list[Run]:
    """All runs through step_batch over one paged pool (of `blocks`, default a whole context
    per run): a run opens its first turn at its join step, its next turn as soon as the last
    one is done (commit_pending first, as the engine does between turns).  in_batch: a turn's
    input and its last set are committed in the batched forwards too (as
    runtime/sessions/batcher.py does), the input beside the others' steps."""
    w = next(model.parameters())
    pool = KVPool(model.cfg, blocks or contexts(model, len(runs)), dtype=w.dtype, device=w.device)
    outs = [Run(r.turns, r.join) for r in runs]
    caches: list[PooledCache | None] = [None] * len(runs)
    states: list[DecodeState | None] = [None] * len(runs)
    nxt = [0] * len(runs)  # the next turn to open
    commits: list[tuple[PooledCache, list[int], list[int]]] = []

    def defer(cache: KVCache, ids: list[int], pos: list[int]) -> int:
        assert isinstance(cache, PooledCache)
        commits.append((cache, ids, pos))
        return 1

    step = 0
    while any(n < len(r.turns) for n, r in zip(nxt, runs)) or any(s is not None and not s.done for s in states):
        opened = set()
        for i, r in enumerate(runs):  # join, or open the next turn (a turn of 0 steps is done at once)
            s = states[i]
            while r.join <= step and nxt[i] < len(r.turns) and (s is None or s.done):
                if caches[i] is None:
                    caches[i] = pool.take()
                cache = caches[i]
                assert cache is not None
                if s is not None:
                    commit_pending(model, cache, s, defer if in_batch else None)
                    if commits:  # a row commits once per forward: its last set before its next input
                        step_batch(model, [], commits)
                        commits.clear()
                    outs[i].tokens.append(list(s.tokens))
                s = states[i] = _open(model, cache, s, r.turns[nxt[i]], defer if in_batch else None)
                outs[i].logits.append([])
                nxt[i] += 1
                opened.add(i)
        # a turn whose input is committed in this forward steps from the next one
        live = [i for i, s in enumerate(states) if s is not None and not s.done and not (commits and i in opened)]
        if live or commits:
            seqs = [(caches[i], states[i], runs[i].turns[nxt[i] - 1].params) for i in live]
            for i, ev in zip(live, step_batch(model, seqs, commits)):  # type: ignore[arg-type]
                assert not isinstance(ev, Exception)
                outs[i].logits[-1].append(ev.logits)
            commits.clear()
        step += 1
    for i, out in enumerate(outs):
        cache, s = caches[i], states[i]
        assert cache is not None and s is not None
        commit_pending(model, cache, s)
        out.tokens.append(list(s.tokens))
        out.ledger = list(zip(cache.positions, cache.tokens))
        pool.give_back(cache)
    assert sorted(pool.free) == list(range(pool.blocks)) and not any(pool.ref), "every block back"
    return outs


def exact(model: SetDLM) -> bool:
    """Are batched logits the batch-1 ones bit for bit here?  Where each sequence attends alone
    (model/batch.py ALONE_ON: the CPU, unless a test groups them) and this machine's products
    give a row its bits whatever the rows beside it, padded (model/linear.py)."""
    w = next(model.parameters())
    return w.device.type in batch.ALONE_ON and all(
        min_rows(w.dtype, torch.get_num_threads(), m.in_features, m.out_features) is not None
        for m in model.modules() if isinstance(m, Linear))


def assert_same(model: SetDLM, runs: list[Run], blocks: int | None = None, in_batch: bool = False) -> None:
    """Tokens and commit order identical; every step's logits bit for bit where exact(), else to
    float tolerance (the padded groups of a GPU, run here on the CPU)."""
    refs = [alone(model, r) for r in runs]
    got = batched(model, runs, blocks, in_batch)
    bits = exact(model)
    for i, (ref, out) in enumerate(zip(refs, got)):
        assert out.tokens == ref.tokens, f"sequence {i}: tokens differ"
        assert out.ledger == ref.ledger, f"sequence {i}: commit order differs"
        for a, b in zip(ref.logits, out.logits):
            assert len(a) == len(b), f"sequence {i}: a different number of steps"
            for j, (x, y) in enumerate(zip(a, b)):
                if bits:
                    assert torch.equal(y, x), f"sequence {i}: step {j}'s logits differ in the batch"
                else:
                    torch.testing.assert_close(y, x, atol=ATOL, rtol=0)


def _prompt(g: torch.Generator, n: int, vocab: int) -> list[int]:
    return [2] + torch.randint(4, vocab, (n - 1,), generator=g).tolist()


# ---- random weights -------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["set", "prefix", "block", "ar"])
def test_every_policy_decodes_the_same_tokens_batched_as_alone(model: SetDLM, policy: str, attend: str) -> None:
    g = torch.Generator().manual_seed(hash(policy) % 1000)
    runs = []
    for i in range(5):  # different prompt lengths, windows, taus and lengths in one batch
        W = 1 if policy == "ar" else 2 + i
        p = DecodeParams(policy=policy, window=W, tau=[0.3, None, 0.0, 0.15, 0.5][i], max_new_tokens=10 + 4 * i)
        runs.append(Run([Turn(_prompt(g, 3 + 7 * i, model.cfg.vocab_size), p)]))
    assert_same(model, runs)


def test_random_params_sessions_joining_and_leaving_with_second_turns(model: SetDLM, attend: str) -> None:
    g = torch.Generator().manual_seed(7)
    runs = []
    for i in range(6):
        turns = [Turn(_prompt(g, 4 + 3 * i, model.cfg.vocab_size), random_params(g, max_new_tokens=8 + 3 * i)),
                 Turn(_prompt(g, 3, model.cfg.vocab_size)[1:], random_params(g, max_new_tokens=6 + i))]
        runs.append(Run(turns, join=[0, 0, 2, 5, 9, 14][i]))
    assert_same(model, runs)


def test_inputs_committed_in_the_batch_long_and_short_beside_steps(model: SetDLM, attend: str) -> None:
    """A turn's input joins the batched forward, long or short, beside the steps (grouped: a
    long one, more than model/batch.py LONG tokens, in a group of its own): the same tokens and
    K/V as prefilled alone."""
    g = torch.Generator().manual_seed(5)
    runs = []
    for i, (n0, n1) in enumerate([(5, 3), (40, 36), (70, 4), (9, 50), (33, 33)]):
        turns = [Turn(_prompt(g, n0, model.cfg.vocab_size), random_params(g, max_new_tokens=8 + 2 * i)),
                 Turn(_prompt(g, n1, model.cfg.vocab_size), random_params(g, max_new_tokens=6 + i))]
        runs.append(Run(turns, join=[0, 0, 1, 3, 4][i]))
    assert_same(model, runs, in_batch=True)


def test_an_infill_beside_plain_turns_and_stop_sequences(model: SetDLM, attend: str) -> None:
    g = torch.Generator().manual_seed(3)
    mask = model.cfg.mask_id
    holes = _prompt(g, 20, model.cfg.vocab_size)
    for j in (5, 6, 9, 14, 15, 16):
        holes[j] = mask
    plain = DecodeParams(policy="set", window=4, tau=0.3, max_new_tokens=16)
    ref = alone(model, Run([Turn(_prompt(g, 6, model.cfg.vocab_size), plain)]))
    produced = ref.tokens[0][6:]
    stop = DecodeParams(policy="set", window=4, tau=0.3, max_new_tokens=16, stop=[produced[3:5]])  # stops mid-region
    runs = [Run([Turn(holes, DecodeParams(policy="set", window=3, tau=0.2), infill=True)]),
            Run(ref.turns), Run([Turn(ref.turns[0].ids, stop)], join=1),
            Run([Turn(_prompt(g, 9, model.cfg.vocab_size), replace(plain, policy="prefix", window=6))], join=3)]
    out = batched(model, runs)
    assert len(out[2].tokens[0]) < len(ref.tokens[0]), "the stop sequence cut the third sequence"
    assert_same(model, runs)


class _Favouring(torch.nn.Module):
    """A vocabulary projection that makes the special ids the most probable tokens everywhere."""

    def __init__(self, inner: torch.nn.Module, ids: Sequence[int]) -> None:
        super().__init__()
        self.inner = inner
        self.bias = torch.zeros(inner.weight.shape[0])  # type: ignore[index]
        self.bias[list(ids)] = 50.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + self.bias.to(x.dtype)


def test_an_infill_hole_is_never_a_special_token_alone_or_batched(model: SetDLM, attend: str) -> None:
    """A hole is a token of the text: where the model would put [EOS], [BOS] or [PAD] there, the
    most probable other token stands (a plain turn beside it still ends at its [EOS])."""
    m = copy.deepcopy(model)
    specials = sorted(m.cfg.special_ids - {m.cfg.mask_id})
    m.lm_head = _Favouring(m.lm_head, specials)  # type: ignore[assignment]
    g = torch.Generator().manual_seed(5)
    holes = _prompt(g, 12, m.cfg.vocab_size)
    for j in (3, 4, 8, 11):
        holes[j] = m.cfg.mask_id
    runs = [Run([Turn(holes, DecodeParams(policy="set", window=2, tau=0.5), infill=True)]),
            Run([Turn(_prompt(g, 5, m.cfg.vocab_size), DecodeParams(policy="set", window=4, tau=0.5,
                                                                     max_new_tokens=8))])]
    ref = alone(m, runs[0])
    filled = [ref.tokens[0][j] for j in (3, 4, 8, 11)]
    assert not set(filled) & m.cfg.special_ids, filled
    assert alone(m, runs[1]).tokens[0][5] in specials, "the plain turn's first token: a special id (the bias works)"
    assert_same(m, runs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_sequence_attends_as_it_does_alone_bit_for_bit(model: SetDLM, dtype: torch.dtype) -> None:
    """BatchKV.attend gives each sequence the very attention call a batch-1 forward makes (its
    keys unpadded, its own mask): the same bits, in fp32 and in bf16, whatever stands beside it
    (a step, a second document, a long input)."""
    model = copy.deepcopy(model).to(dtype)  # the fixture is the module's: never cast in place
    cfg, g = model.cfg, torch.Generator().manual_seed(9)
    pool = KVPool(cfg, contexts(model, 3), dtype=dtype)
    pool.free.rotate(5)  # blocks out of order: a cache's slots are scattered over the pool
    cases = [(_prompt(g, 9, cfg.vocab_size), 2, 8), (_prompt(g, 30, cfg.vocab_size) + [cfg.bos_id, 7, 8], 0, 3),
             (_prompt(g, 4, cfg.vocab_size), 40, 0)]  # (context, pending, masks): a step, a new document, an input
    rows, alone_ = [], []
    for ctx, *_ in cases:
        row, one = pool.take(), KVCache.for_model(cfg, dtype=dtype)
        prefill(model, row, ctx, list(range(len(ctx))))
        prefill(model, one, ctx, list(range(len(ctx))))
        rows.append(row)
        alone_.append(one)
    ids = [torch.randint(4, cfg.vocab_size, (m,), generator=g).tolist() + [cfg.mask_id] * a for _, m, a in cases]
    ids[2][5] = cfg.bos_id  # the input holds a new document's start: its later tokens see none before it
    pos = [list(range(len(c), len(c) + len(x))) for (c, _, _), x in zip(cases, ids)]
    N, H, Hkv, D = sum(map(len, ids)), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q, k, v = (torch.randn(1, N, h, D, generator=g).to(dtype) for h in (H, Hkv, Hkv))
    kv = BatchKV(rows, torch.tensor(sum(ids, [])), torch.tensor(sum(pos, [])), [len(x) for x in ids],
                 [m for _, m, _ in cases], cfg.doc_start_id, dtype)
    got = kv.attend(1, q, k, v, None)  # (1, N, H * D)
    o = 0
    for one, x, p_, (_, m, _) in zip(alone_, ids, pos, cases):
        n = len(x)
        one.reserve(n)
        ids_t, pos_t = torch.tensor(x), torch.tensor(p_)
        mask = within_documents(step_mask(one.length, m, n - m), torch.cat([one.pos[:one.length], pos_t]),
                                torch.cat([one.tok[:one.length], ids_t]), pos_t, cfg.doc_start_id)
        want = one.attend(1, q[:, o:o + n], k[:, o:o + n], v[:, o:o + n], additive(mask[None], dtype, q.device))
        assert torch.equal(got[:, o:o + n], want), f"a sequence of {n} new tokens attends differently in the batch"
        o += n


def test_the_batch_mask_is_each_sequences_step_mask_and_padding_sees_one_key() -> None:
    cached, pending, new = [5, 0, 3], [2, 0, 3], [6, 3, 4]
    S = max(c + n for c, n in zip(cached, new))
    mask = batch_mask(cached, pending, new, S)
    assert mask.shape == (3, 6, S)
    for b, (C, m, n) in enumerate(zip(cached, pending, new)):
        assert torch.equal(mask[b, :n, : C + n], step_mask(C, m, n - m))
        assert not mask[b, :n, C + n:].any(), "padded keys are nobody's"
        assert torch.equal(mask[b, n:], torch.nn.functional.one_hot(torch.zeros(6 - n, dtype=torch.long), S).bool())


@dataclass(frozen=True)
class Parity:
    """A guide for random weights that opens as a call does: no opinion until a token that is a
    multiple of 7 has been written (a `<call>`); after it, except where the tokens before sum to
    a multiple of 5, a token whose id plus the last token's is a multiple of 3 is refused (about
    a third of every guided row).  A token written right of an open mask before the guide opens
    must still be held to it once the mask becomes the opener: set and block decode out of order."""

    def allows(self, before: Sequence[int], token: int) -> bool | None:
        if not any(t % 7 == 0 for t in before) or sum(before) % 5 == 0:
            return None
        return (token + before[-1]) % 3 != 0


@pytest.mark.parametrize("policy", ["set", "block"])
def test_under_a_guide_a_step_commits_only_the_run_from_the_leftmost_mask(model: SetDLM, policy: str) -> None:
    """set and block may commit a confident mask right of undecided ones; under a guide that has
    no opinion yet (no call opened), that token would never be checked once a later step writes
    the opener left of it.  So under a guide a step commits only the run from the leftmost."""
    params = DecodeParams(policy=policy, window=4, tau=0.9, max_new_tokens=4, guide=Parity())
    cache = KVCache.for_model(model.cfg)
    state = begin_turn(model, cache, None, [2, 5, 6], params)
    p = plan(model, state, params)
    logits = torch.zeros(4, model.cfg.vocab_size)
    logits[:3, 5] = 0.5  # three undecided masks (probability ~ 1/vocab) ...
    logits[3, 9] = 30.0  # ... and a sure one right of them: alone, set and block would commit it first
    unguided = DecodeState.from_json(state.to_json())
    advance(model, KVCache.for_model(model.cfg), unguided, replace(params, guide=None), p, logits.clone())
    assert unguided.pending == [p.active[3]]
    advance(model, cache, state, params, p, logits)
    assert state.pending == [p.active[0]] and state.tokens[p.active[0]] == 5


@pytest.mark.parametrize("policy", ["set", "prefix", "block", "ar"])
def test_guided_decoding_holds_the_guide_and_is_the_same_batched(model: SetDLM, policy: str, attend: str) -> None:
    """A guide (model.params.Guide) refuses tokens; the decoder takes the next allowed one, left
    to right where it guides, and every decoded token then holds against the tokens really
    before it; batched and alone decode the same."""
    g = torch.Generator().manual_seed(11)
    runs = []
    for i in range(5):
        W = 1 if policy == "ar" else 2 + i
        p = DecodeParams(policy=policy, window=W, tau=[0.3, None, 0.0, 0.15, 0.5][i], max_new_tokens=12 + 3 * i,
                         guide=Parity())
        runs.append(Run([Turn(_prompt(g, 3 + 5 * i, model.cfg.vocab_size), p)]))
    assert_same(model, runs)
    refused = 0
    for r in runs:
        toks, start = alone(model, r).tokens[0], len(r.turns[0].ids)
        for pos in range(start, len(toks)):
            verdict = Parity().allows(toks[start:pos], toks[pos])
            assert verdict is not False, f"position {pos} holds a token the guide refuses"
        unguided = alone(model, Run([Turn(r.turns[0].ids, replace(r.turns[0].params, guide=None))])).tokens[0]
        refused += unguided != toks
    assert refused, "the guide changed no run: the test tests nothing"


def test_commits_in_a_batched_forward_are_the_causal_prefills(model: SetDLM) -> None:
    """A turn's input (or its last set) committed beside other rows' steps: the same K/V and
    ledger as prefill alone, and the steps' events as alone."""
    g = torch.Generator().manual_seed(5)
    pool = KVPool(model.cfg, 3)
    prompts = [_prompt(g, n, model.cfg.vocab_size) for n in (7, 12, 3)]
    p = DecodeParams(policy="set", window=4, tau=0.3, max_new_tokens=8)
    ref = alone(model, Run([Turn(prompts[0], p)]))
    a, b, c = pool.take(), pool.take(), pool.take()
    assert a is not None and b is not None and c is not None
    s = begin_turn(model, a, None, prompts[0], p)  # a decodes while b and c commit their inputs
    events = []
    for i, cache in enumerate((b, c)):
        events += step_batch(model, [(a, s, p)], [(cache, prompts[i + 1], list(range(len(prompts[i + 1]))))])
    while not s.done:
        events += step_batch(model, [(a, s, p)])
    commit_pending(model, a, s)
    assert s.tokens == ref.tokens[0]
    for cache, ids in ((b, prompts[1]), (c, prompts[2])):
        want = KVCache.for_model(model.cfg)
        begin_turn(model, want, None, ids, replace(p, max_new_tokens=0))
        assert cache.positions == want.positions and cache.tokens == want.tokens
        n = want.length
        torch.testing.assert_close(cache.k[:, :n], want.k[:, :n], atol=ATOL, rtol=0)
        torch.testing.assert_close(cache.v[:, :n], want.v[:, :n], atol=ATOL, rtol=0)


def test_a_failure_after_the_forward_is_no_failure_of_the_forward(model: SetDLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch's greedy choice runs after the forward committed: if it fails, each sequence
    chooses on its own (the forward is never run again, nothing is committed twice)."""
    def broken(*args: object) -> None:
        raise RuntimeError("out of memory")

    monkeypatch.setattr("model.batch.greedy", broken)
    g = torch.Generator().manual_seed(2)
    p = DecodeParams(policy="set", window=4, tau=0.3, max_new_tokens=10)
    assert_same(model, [Run([Turn(_prompt(g, 4 + 5 * i, model.cfg.vocab_size), p)], join=i) for i in range(3)])
