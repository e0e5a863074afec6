"""runtime/sessions/batcher.py with the engine: turns of many threads decoded in one batch write
the tokens each writes alone (shipped model, real Redis and SQLite); a turn that leaves early
(its consumer stops: a cancel, a failure) disturbs no other; a warm session holds the blocks
of its tokens; a full pool evicts an idle warm session, never a running one, and a turn waits
for a place while the pool's whole contexts all run turns."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest
import redis
import torch
from sqlalchemy import Engine as SqlEngine

from domain.draws import make_payload
from model import shipped
from model.params import DecodeParams
from model.pool import BLOCK, KVPool, PooledCache
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.sessions.batcher import Batcher
from runtime.sessions.engine import Engine
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.sessions.turn import TurnResult
from runtime.settings import Settings
from workflows.narrative import prompt_ids

POLICIES = [("set", 4, 0.9), ("prefix", 8, 0.99), ("ar", 1, None), ("block", 4, 0.9), ("prefix", 4, 0.9),
            ("set", 8, 0.7), ("prefix", 8, 0.99), ("ar", 1, None)]
FOLLOW_UP = "\nnarrative: "


@pytest.fixture(scope="module")
def loaded() -> tuple[SetDLM, Tokenizer]:
    return shipped.load()


@pytest.fixture
def make_engine(loaded: tuple[SetDLM, Tokenizer], client: redis.Redis, settings: Settings, tmp_path: Path,
                db_engine: SqlEngine) -> Callable[..., Engine]:
    """An engine on the shared SQL and Redis: batched (a pool of `rows` whole contexts, or of
    `blocks`, and a batcher) or one turn at a time."""
    engines: list[Engine] = []

    def make(rows: int = 0, max_batch: int = 16, warm: int = 8, write_behind: int = Engine.WRITE_BEHIND,
             blocks: int = 0) -> Engine:
        model = loaded[0]
        s = settings.model_copy(update={"data_dir": tmp_path, "lease_wait_ms": 20_000})
        blocks = blocks or rows * _context(model)
        pool = KVPool(model.cfg, blocks) if blocks else None
        batcher = Batcher(model, max_batch) if blocks else None
        e = Engine(model, SessionStore(client, s), Records(db_engine), s, warm_sessions=warm, batcher=batcher, pool=pool,
                   write_behind=write_behind)
        engines.append(e)
        return e

    yield make  # type: ignore[misc]
    for e in engines:
        if e.batcher is not None:
            e.batcher.close()


def _context(model: SetDLM) -> int:
    """The blocks of a whole context."""
    return -(-model.cfg.max_seq_len // BLOCK)


def _held(e: Engine) -> list[int]:
    """Per warm session, the blocks it holds; they are all the pool's held blocks, each the
    blocks of its tokens."""
    assert e.pool is not None
    tables = [w.cache.table for w in e.warm.values() if isinstance(w.cache, PooledCache)]
    assert [len(t) for t in tables] == [-(-w.cache.length // BLOCK) for w in e.warm.values()]
    assert e.pool.held == sum(map(len, tables)) == len({b for t in tables for b in t})
    return [len(t) for t in tables]


def _turns(tok: Tokenizer, i: int) -> tuple[list[int], list[int], DecodeParams]:
    policy, W, tau = POLICIES[i % len(POLICIES)]
    payload = make_payload(random.Random(40 + i))
    return prompt_ids(tok, payload), tok.encode(FOLLOW_UP), DecodeParams(policy=policy, window=W, tau=tau,
                                                                        max_new_tokens=64 + 8 * (i % 3))


def _session(e: Engine, tok: Tokenizer, i: int, out: dict[int, list[list[int]]]) -> None:
    first, second, params = _turns(tok, i)
    sid = e.open("acme")
    out[i] = [e.run_turn(sid, "acme", first, params).tokens, e.run_turn(sid, "acme", second, params).tokens]


def _alone(e: Engine, tok: Tokenizer, n: int) -> dict[int, list[list[int]]]:
    """Sessions 0..n-1 one after another, one turn at a time: the reference."""
    out: dict[int, list[list[int]]] = {}
    for i in range(n):
        _session(e, tok, i, out)
    return out


def _in_threads(fn: Callable[[int], None], n: int) -> None:
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            fn(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def test_eight_sessions_in_one_batch_write_what_each_writes_alone(make_engine: Callable[..., Engine],
                                                                    loaded: tuple[SetDLM, Tokenizer]) -> None:
    tok = loaded[1]
    alone = _alone(make_engine(), tok, 8)
    e = make_engine(rows=8)
    batched: dict[int, list[list[int]]] = {}
    _in_threads(lambda i: _session(e, tok, i, batched), 8)
    assert batched == alone
    assert e.batcher is not None and e.batcher.stepped > 2 * e.batcher.forwards, "several turns per forward"
    assert len(e.warm) == 8 and len(_held(e)) == 8, "the warm sessions hold the blocks of their tokens"


def test_a_turn_that_leaves_early_disturbs_no_other_and_frees_its_blocks(make_engine: Callable[..., Engine],
                                                                       loaded: tuple[SetDLM, Tokenizer]) -> None:
    tok = loaded[1]
    alone = _alone(make_engine(), tok, 4)
    e = make_engine(rows=4)
    batched: dict[int, list[list[int]]] = {}
    left = threading.Event()

    def run(i: int) -> None:
        if i != 3:
            _session(e, tok, i, batched)
            return
        first, _, params = _turns(tok, i)
        sid = e.open("acme")
        with closing(e.turn(sid, "acme", first, params)) as events:  # stops listening after 3 steps
            for n, ev in enumerate(events):
                assert not isinstance(ev, TurnResult)
                if n == 2:
                    break
        left.set()
        assert sid not in e.warm, "an abandoned turn leaves no warm state"
        _session(e, tok, i, batched)  # the session goes on as if the turn never ran

    _in_threads(run, 4)
    assert left.is_set() and batched == alone
    assert len(e.warm) == 4 and len(_held(e)) == 4


def test_threads_behind_their_turns_write_exact_state_through_stops_that_roll_back(
        make_engine: Callable[..., Engine], loaded: tuple[SetDLM, Tokenizer]) -> None:
    """The batch loop runs a turn ahead of its thread (Batcher.lead): the write-behind copies
    what each event says while the decoder goes on, and a stop's rollback spoils what it copied
    meanwhile.  Slow threads, small write-behind batches and stops mid-set: every session's
    Redis state restores to the same next turn as when decoded alone."""
    tok = loaded[1]
    params = DecodeParams(policy="set", window=8, tau=0.7, max_new_tokens=64)
    ref = make_engine()
    plan: dict[int, tuple[list[int], list[int], DecodeParams]] = {}
    expect: dict[int, list[list[int]]] = {}
    for i in range(4):
        first, second, _ = _turns(tok, i)
        free = ref.run_turn(ref.open("acme"), "acme", first, params).tokens
        at = len(free) // 3 + i % 2
        stop = replace(params, stop=[free[at:at + 2]])  # fires mid-turn, often inside a set
        plan[i] = (first, second, stop)
        sid = ref.open("acme")
        expect[i] = [ref.run_turn(sid, "acme", first, stop).tokens, ref.run_turn(sid, "acme", second, stop).tokens]
    e = make_engine(rows=4, write_behind=2)
    sessions: dict[int, str] = {}
    got: dict[int, list[int]] = {}

    def run(i: int) -> None:
        first, _, stop = plan[i]
        sid = sessions[i] = e.open("acme")
        for ev in e.turn(sid, "acme", first, stop):
            if isinstance(ev, TurnResult):
                got[i] = ev.tokens
            else:
                time.sleep(0.004)  # slower than a step: the turn runs ahead of this thread

    _in_threads(run, 4)
    assert got == {i: t[0] for i, t in expect.items()}
    assert any(e.warm[sid].cache.rollbacks for sid in sessions.values()), "a stop rolled a cache back"
    fresh = make_engine()
    for i, sid in sessions.items():
        r = fresh.run_turn(sid, "acme", plan[i][1], plan[i][2], prefer="restore")
        assert r.path == "restore" and r.tokens == expect[i][1], f"session {i}"


def test_a_full_pool_evicts_an_idle_warm_session_and_a_turn_waits_for_a_running_one(
        make_engine: Callable[..., Engine], loaded: tuple[SetDLM, Tokenizer]) -> None:
    tok = loaded[1]
    ref = make_engine(rows=1, warm=3)
    alone: dict[int, list[list[int]]] = {}
    for i in range(3):
        _session(ref, tok, i, alone)
    t0, t1, t2 = _held(ref)
    assert min(t0, t2) > 2, "sessions of a few blocks each"
    e = make_engine(blocks=t1 + max(t0, t2) + 2)  # two sessions fit, three do not
    got: dict[int, list[list[int]]] = {}
    _session(e, tok, 0, got)  # warm: holds its blocks
    _session(e, tok, 1, got)  # warm too
    first = next(iter(e.warm))
    _session(e, tok, 2, got)  # grows into session 0's blocks: the least recently used idle one gives them back
    assert got == alone and len(e.warm) == 2 and first not in e.warm
    _held(e)
    # the pool's one whole context runs a turn: a second turn waits until it ends, then runs
    e2 = make_engine(rows=1)
    hold = threading.Event()
    done: dict[int, list[list[int]]] = {}
    ends: list[str] = []
    first_ids, _, params = _turns(tok, 0)
    sid = e2.open("acme")

    def slow() -> None:
        with closing(e2.turn(sid, "acme", first_ids, params)) as events:
            for n, _ev in enumerate(events):
                if n == 0:
                    hold.set()
                    threading.Event().wait(0.5)  # holds the pool's only place meanwhile
        ends.append("slow")

    t = threading.Thread(target=slow)
    t.start()
    assert hold.wait(30)
    _session(e2, tok, 1, done)  # waits for the place, then decodes
    ends.append("waiting")
    t.join(60)
    assert done[1] == alone[1] and ends == ["slow", "waiting"]


def test_a_fork_of_a_warm_session_is_warm_and_shares_its_blocks(make_engine: Callable[..., Engine],
                                                                  loaded: tuple[SetDLM, Tokenizer]) -> None:
    """Forked at its first turn, a warm session's child holds that turn's blocks with it (copy
    on write): the child's next turn runs warm, writes what the parent wrote after the same
    turn, copies the shared last block before writing it, and leaves the parent's slots as
    they were; its Redis state restores elsewhere to the same next turn."""
    tok = loaded[1]
    first, second, params = _turns(tok, 1)
    e = make_engine(rows=2)
    sid = e.open("acme")
    e.run_turn(sid, "acme", first, params)
    n = e.warm[sid].cache.length  # the slots of turn 0
    parent_next = e.run_turn(sid, "acme", second, params).tokens
    parent = e.warm[sid].cache
    assert isinstance(parent, PooledCache) and e.pool is not None
    kept = parent.k[:, : parent.length].clone()
    child = e.fork(sid, "acme", 0)
    twin = e.warm[child].cache
    assert isinstance(twin, PooledCache) and twin.length == n and twin.table == parent.table[: len(twin.table)]
    assert all(e.pool.ref[b] == 2 for b in twin.table), "the child's blocks are the parent's"
    r = e.run_turn(child, "acme", second, params)
    assert r.path == "warm" and r.tokens == parent_next
    assert torch.equal(parent.k[:, : parent.length], kept), "the parent's slots are untouched"
    assert n % BLOCK == 0 or twin.table[n // BLOCK] != parent.table[n // BLOCK], "the shared last block was copied"
    fresh = make_engine()
    third = tok.encode(FOLLOW_UP)
    assert fresh.run_turn(child, "acme", third, params, prefer="restore").tokens == \
        e.run_turn(sid, "acme", third, params).tokens, "the child's Redis state is the parent's after the same turns"


def test_an_empty_turn_and_a_failed_batched_forward_disturb_no_other(
        make_engine: Callable[..., Engine], loaded: tuple[SetDLM, Tokenizer], monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn with nothing to decode (max_new_tokens 0) never joins a batch; a batched forward
    that fails is retried turn by turn, so its turns still write what they write alone."""
    import runtime.sessions.batcher as batcher_module

    tok = loaded[1]
    alone = _alone(make_engine(), tok, 4)
    real, calls = batcher_module.step_batch, [0]

    def flaky(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        if calls[0] % 5 == 3:
            raise RuntimeError("a device error in the batched forward")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(batcher_module, "step_batch", flaky)
    e = make_engine(rows=5)
    got: dict[int, list[list[int]]] = {}
    empty: list[list[int]] = []

    def run(i: int) -> None:
        if i == 4:
            first, _, params = _turns(tok, 0)
            sid = e.open("acme")
            empty.append(e.run_turn(sid, "acme", first, replace(params, max_new_tokens=0)).tokens)
        else:
            _session(e, tok, i, got)

    _in_threads(run, 5)
    assert got == alone and empty == [[]] and calls[0] > 5


def test_a_load_that_fails_gives_its_blocks_back(make_engine: Callable[..., Engine],
                                                   loaded: tuple[SetDLM, Tokenizer],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.sessions.resume as engine_module

    tok = loaded[1]
    e = make_engine(rows=2)
    first, second, params = _turns(tok, 0)
    sid = e.open("acme")
    e.run_turn(sid, "acme", first, params)
    e.warm.clear()  # the next turn recomputes from SQL (the blocks it held stay held: dropped here)
    assert e.pool is not None
    free = len(e.pool.free)

    def broken(*args: object, **kwargs: object) -> int:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(engine_module, "prefill", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        e.run_turn(sid, "acme", second, params, prefer="recompute")
    assert len(e.pool.free) == free, "the blocks the recompute took are back"


def test_events_reach_their_threads_in_order_in_chunks_never_more_than_lead_behind(
        loaded: tuple[SetDLM, Tokenizer]) -> None:
    """Batcher(lead=4, chunk=2): a slow thread takes every event of its turn, in step order, the
    same as decoded alone; its turn never runs more than `lead` steps past the event its thread
    holds; and the events come in chunks (fewer wake-ups than events)."""
    from model.decode import begin_turn, decode
    from model.kv_cache import KVCache

    model, tok = loaded
    params = DecodeParams(policy="set", window=4, tau=0.9, max_new_tokens=40)
    prompts = [[model.cfg.bos_id, *prompt_ids(tok, make_payload(random.Random(i)))] for i in range(3)]
    alone = []
    for ids in prompts:
        cache = KVCache.for_model(model.cfg)
        state = begin_turn(model, cache, None, ids, params)
        alone.append([(ev.positions, ev.tokens) for ev in decode(model, cache, state, params)])
    pool, batcher = KVPool(model.cfg, 3 * _context(model)), Batcher(model, lead=4, chunk=2)
    wakeups, real_next = [0], batcher._next

    def counting(events: object) -> object:
        wakeups[0] += 1
        return real_next(events)  # type: ignore[arg-type]

    batcher._next = counting  # type: ignore[method-assign,assignment]
    got: dict[int, list[tuple[list[int], list[int]]]] = {}
    ahead: list[int] = []

    def run(i: int) -> None:
        cache = pool.take()
        assert cache is not None
        state = begin_turn(model, cache, None, prompts[i], params, batcher.commit)
        got[i] = []
        for ev in batcher.steps(cache, state, params):
            assert ev.step == len(got[i]), "in step order"
            if ev.step == 0:  # hold the first event until the turn has run 2 steps past it (no timing)
                deadline = time.monotonic() + 30
                while state.step - 1 - ev.step < 2 and time.monotonic() < deadline:
                    time.sleep(0.001)
            ahead.append(state.step - 1 - ev.step)  # steps decoded past the event this thread holds
            got[i].append((ev.positions, ev.tokens))
            time.sleep(0.003)  # mostly slower than a step

    try:
        _in_threads(run, 3)
    finally:
        batcher.close()
    assert [got[i] for i in range(3)] == alone
    assert max(ahead) <= 4 and max(ahead) >= 2, "the turns ran ahead of their threads, within the lead"
    assert wakeups[0] < sum(map(len, alone)), "events came in chunks"


class _LoopBug(BaseException):
    """What no forward's own handling catches: the loop itself dies of it."""


def test_a_batch_loop_that_dies_fails_its_turns_at_once_and_calls_on_death(
        loaded: tuple[SetDLM, Tokenizer], monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop, not a forward, dies: every turn in it fails now (not at its next 1 s check),
    on_death hears why (a worker exits there: workers/process.py), and the batcher takes no
    new turn or commit."""
    import runtime.sessions.batcher as batcher_module
    from model.decode import begin_turn

    model, tok = loaded

    def bug(*args: object, **kwargs: object) -> object:
        raise _LoopBug("a bug in the loop")

    monkeypatch.setattr(batcher_module, "step_batch", bug)
    died: list[BaseException] = []
    b = Batcher(model, 4, on_death=died.append)
    pool = KVPool(model.cfg, 2 * _context(model))
    rows = [pool.take(), pool.take()]
    first, _, params = _turns(tok, 1)
    states = [begin_turn(model, c, None, first, params) for c in rows if c is not None]  # prefilled here: not batched
    with pytest.raises(RuntimeError, match="batch loop died"):  # its own error, not the 1 s check's "has stopped"
        for c, s in zip(rows, states):
            assert c is not None
            for _ in b.steps(c, s, params):
                pass
    b._thread.join(5)
    assert len(died) == 1 and isinstance(died[0], _LoopBug)
    c = rows[1]
    assert c is not None
    with pytest.raises(RuntimeError):
        next(iter(b.steps(c, states[1], params)))
    with pytest.raises(RuntimeError):
        b.commit(c, [5], [c.length])


def test_a_batching_worker_exits_when_its_batch_loop_dies(loaded: tuple[SetDLM, Tokenizer], client: redis.Redis,
                                                         settings: Settings, db_engine: SqlEngine) -> None:
    """workers/process.py builds its batcher with on_death = _exit (the process exits as after a
    crash: its jobs are taken over)."""
    from workers import process

    s = settings.model_copy(update={"batch_sessions": 2})
    e = process.engine(loaded[0], SessionStore(client, s), Records(db_engine), s)
    try:
        assert e.batcher is not None and e.batcher._on_death is process._exit
    finally:
        assert e.batcher is not None
        e.batcher.close()


def test_a_held_turn_sits_out_while_another_runs_and_writes_what_it_writes_alone(
        loaded: tuple[SetDLM, Tokenizer], monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn of a tenant held to its share (priority "held") steps while it is alone; once
    another tenant's turn joins, every forward is that turn's only until it is done, and then
    the held one goes on.  Both write the tokens each writes alone.  Deterministic: the held
    turn's thread holds its first event until the other turn is in the batch."""
    from model.decode import begin_turn, decode
    from model.kv_cache import KVCache
    from runtime.sessions import batcher as batcher_module

    model, tok = loaded
    params = [DecodeParams(policy="ar", window=1, max_new_tokens=48), DecodeParams(policy="set", window=4, tau=0.9,
                                                                                  max_new_tokens=24)]
    prompts = [[model.cfg.bos_id, *prompt_ids(tok, make_payload(random.Random(60 + i)))] for i in range(2)]
    alone = []
    for ids, p in zip(prompts, params, strict=True):
        cache = KVCache.for_model(model.cfg)
        alone.append([ev.tokens for ev in decode(model, cache, begin_turn(model, cache, None, ids, p), p)])
    forwards: list[set[int]] = []  # per batched forward, which turns (0 held, 1 the other) stepped
    caches: dict[int, int] = {}  # id(cache) -> turn
    real = batcher_module.step_batch

    def recording(m: SetDLM, seqs: list[tuple[PooledCache, object, DecodeParams]], commits: list[object]) -> object:
        if seqs:
            forwards.append({caches[id(c)] for c, _, _ in seqs})
        return real(m, seqs, commits)  # type: ignore[arg-type]

    monkeypatch.setattr(batcher_module, "step_batch", recording)
    pool, batcher = KVPool(model.cfg, 2 * _context(model)), Batcher(model, lead=4, chunk=1)
    got: dict[int, list[list[int]]] = {0: [], 1: []}
    joined = threading.Event()

    def run(i: int) -> None:
        cache = pool.take()
        assert cache is not None
        caches[id(cache)] = i
        state = begin_turn(model, cache, None, prompts[i], params[i], batcher.commit)
        for ev in batcher.steps(cache, state, params[i], "held" if i == 0 else "interactive"):
            got[i].append(ev.tokens)
            if i == 0 and len(got[0]) == 1:
                threading.Thread(target=run_other, daemon=True).start()
                deadline = time.monotonic() + 30
                while not any(s.priority == "interactive" for s in batcher.running) and time.monotonic() < deadline:
                    time.sleep(0.001)
                joined.set()

    errors: list[BaseException] = []
    done_other = threading.Event()

    def run_other() -> None:
        try:
            run(1)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            done_other.set()

    try:
        run(0)
        assert done_other.wait(60)
    finally:
        batcher.close()
    assert not errors, errors
    assert joined.is_set() and [got[0], got[1]] == alone, "each writes what it writes alone"
    assert not any(f == {0, 1} for f in forwards), "never a forward of both: the held turn sat out"
    first_other = next(i for i, f in enumerate(forwards) if 1 in f)
    last_other = max(i for i, f in enumerate(forwards) if 1 in f)
    assert all(f == {1} for f in forwards[first_other:last_other + 1]), "the other's forwards are its own"
    assert 0 in forwards[0] and any(0 in f for f in forwards[last_other + 1:]), "held: before it joined, and after"
