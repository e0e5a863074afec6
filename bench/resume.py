"""Resume benchmark: the three ways a session's next turn gets its state, side by side.

Per (preset, history length): time to the first committed set of the next turn when the session
is warm in this process, restored from Redis, or recomputed from the SQL ledger; the path the
engine's cost model chooses and its time; KV bytes per token; the raw pipelined Redis GET
bandwidth measured in the same run (1 MiB values) and the restore bandwidth as a fraction of it;
the pool memory the session holds warm (model/pool.py's blocks of 16 tokens, and of 32; the
static row of the whole context it replaced) against its tokens' bytes; and the store writes'
cost against the decode time of a turn (commit overhead).  Medians of --repeats runs.  Models
have random weights: the costs depend on the shapes, not the weights.

    python bench/resume.py [--quick] [--repeats N] [--threads N] [--presets qwen3-0.6b,qwen3-1.7b]
                           [--histories 256,1024,2048] [--dtype fp32|bf16] [--device cpu|cuda]

Uses REDIS_URL when set, else the embedded Redis; a throw-away SQLite file; its own key prefix.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root (bench/ too), as a script

import torch

from model.config import ModelConfig
from model.decode import begin_turn, commit_pending, decode
from model.params import DecodeParams
from model.pool import BLOCK, KVPool, PooledCache
from model.transformer import SetDLM
from runtime.db import make_engine
from runtime.embedded import connect
from runtime.sessions import kv
from runtime.sessions.engine import Engine
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore, replayed
from runtime.sessions.turn import TurnResult
from runtime.settings import Settings

PRESETS = {  # the shipped shape (context widened to hold the longest history) and a wider one
    "small": ModelConfig.from_name("small", max_seq_len=4608),
    "wide": ModelConfig.from_name("small", d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, d_ff=2048,
                                  max_seq_len=4608),
}
#: the released SetDLMs' shapes (Qwen3-0.6B and -1.7B: 28 layers, 8 KV heads of 128, a 151936
#: vocabulary, RoPE theta 1e6): 112 KiB of K/V per token in bf16, 224 in fp32.  Random weights:
#: the costs depend on the shapes, not the weights.  --presets qwen3-0.6b,qwen3-1.7b
REALISTIC = {
    "qwen3-0.6b": ModelConfig(name="qwen3-0.6b", vocab_size=151936, d_model=1024, n_layers=28, n_heads=16,
                              n_kv_heads=8, head_dim=128, d_ff=3072, max_seq_len=2304, rope_theta=1e6),
    "qwen3-1.7b": ModelConfig(name="qwen3-1.7b", vocab_size=151936, d_model=2048, n_layers=28, n_heads=16,
                              n_kv_heads=8, head_dim=128, d_ff=6144, max_seq_len=2304, rope_theta=1e6),
}
HISTORIES = (256, 1024, 4096)
REALISTIC_HISTORIES = (256, 1024, 2048)
QUICK = {"presets": ("small",), "histories": (256, 1024), "repeats": 1}
NEXT = DecodeParams(policy="ar", max_new_tokens=8)  # the measured turn: 4 input tokens, then decode
COMMIT_TURN = DecodeParams(policy="ar", max_new_tokens=64)  # the turn whose store writes are timed


def first_set_ms(engine: Engine, sid: str, prefer: str, warm: bool) -> tuple[float, str]:
    """Run one turn; ms from its start to its first StepEvent (the first committed set)."""
    if not warm:
        engine.warm.clear()
    t0 = time.perf_counter()
    first = None
    path = ""
    for ev in engine.turn(sid, "bench", [10, 11, 12, 13], NEXT, prefer=prefer):
        if first is None:
            first = time.perf_counter() - t0
        if isinstance(ev, TurnResult):
            path = ev.path
    assert first is not None
    return first * 1000, path


def raw_get_bytes_per_s(engine: Engine, nbytes: int) -> float:
    r = engine.store.r
    keys = [f"{engine.s.key_prefix}:raw:{i}" for i in range(max(4, -(-nbytes // 2**20)))]
    blob = secrets.token_bytes(2**20)
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.set(k, blob)
    pipe.execute()
    t0 = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.get(k)
    pipe.execute()
    dt = time.perf_counter() - t0
    r.delete(*keys)
    return len(keys) * 2**20 / dt


def restore_bytes_per_s(engine: Engine, sid: str) -> tuple[float, int]:
    m = engine.store.read(sid)
    assert m is not None
    t0 = time.perf_counter()
    cache = kv.from_segments(engine.store.get_segments(m.segments), engine.fp, *m.state["ledger"])
    dt = time.perf_counter() - t0
    assert cache.length == m.slots
    return m.nbytes / dt, m.nbytes


def _drop(engine: Engine) -> None:
    """Delete the engine's Redis keys (its own prefix) and close its database."""
    keys = list(engine.store.r.scan_iter(f"{engine.s.key_prefix}:*", count=1000))
    if keys:
        engine.store.r.delete(*keys)
    engine.records.engine.dispose()


def model_of(preset: str, dtype: torch.dtype, device: str) -> SetDLM:
    torch.manual_seed(0)
    with torch.device(device):  # built where it runs: a 1.7B model is not made twice
        model = SetDLM({**PRESETS, **REALISTIC}[preset]).eval()
    return model.to(dtype)


def pool_row_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """What a warm session held in the worker's KV pool before it was paged: a static row of the
    whole context, whatever its length."""
    return 2 * cfg.n_layers * cfg.max_seq_len * cfg.n_kv_heads * cfg.head_dim * torch.finfo(dtype).bits // 8


@torch.no_grad()
def pool_held(engine: Engine, sid: str, block_size: int, device: str) -> tuple[int, int]:
    """What the session holds warm in a batching worker's paged pool (model/pool.py), and its
    slots: its segments restored straight into the blocks, the next turn decoded there, then
    trimmed to its tokens as the engine keeps it warm.  (pool bytes, slots)"""
    m = engine.store.read(sid)
    assert m is not None
    positions, tokens = m.state["ledger"]
    model = engine.model
    w = next(model.parameters())
    pool = KVPool(model.cfg, -(-(m.slots + 64) // block_size), w.dtype, device, block_size)
    cache = kv.from_segments(engine.store.get_segments(m.segments), engine.fp, positions, tokens, device,
                             into=pool.take())
    assert isinstance(cache, PooledCache)
    state = begin_turn(model, cache, replayed(list(zip(positions, tokens)), None), [10, 11, 12, 13], NEXT)
    for _ in decode(model, cache, state, NEXT):
        pass
    commit_pending(model, cache, state)
    cache.trim()
    assert pool.held * pool.block_bytes == cache.nbytes
    return cache.nbytes, cache.length


def measure(preset: str, history: int, repeats: int, settings: Settings, client: Any,
            dtype: torch.dtype = torch.float32, device: str = "cpu", model: SetDLM | None = None) -> dict[str, Any]:
    model = model if model is not None else model_of(preset, dtype, device)
    s = settings.model_copy(update={"key_prefix": f"sfbench-{secrets.token_hex(4)}"})
    engine = Engine(model, SessionStore(client, s), Records(make_engine(s)), s)
    engine.rates()  # the cost model's one-time calibration, outside the timings
    try:
        rng = random.Random(history)
        sid = engine.open("bench")
        engine.run_turn(sid, "bench", [rng.randrange(16, model.cfg.vocab_size) for _ in range(history)],
                        DecodeParams(policy="ar", max_new_tokens=4))
        first_set_ms(engine, sid, "restore", warm=False)  # warm-up: first-call costs out of the timings
        times: dict[str, list[float]] = {"warm": [], "restore": [], "recompute": [], "auto": []}
        chosen = []
        raw, rest, nbytes = [], [], 0
        for _ in range(repeats):
            times["warm"].append(first_set_ms(engine, sid, "auto", warm=True)[0])
            for p in ("restore", "recompute"):
                ms, path = first_set_ms(engine, sid, p, warm=False)
                assert path == p, (p, path)
                times[p].append(ms)
            ms, path = first_set_ms(engine, sid, "auto", warm=False)
            times["auto"].append(ms)
            chosen.append(path)
            bps, nbytes = restore_bytes_per_s(engine, sid)
            rest.append(bps)
            raw.append(raw_get_bytes_per_s(engine, nbytes))
        med = {k: statistics.median(v) for k, v in times.items()}
        slots = engine.store.read(sid).slots  # type: ignore[union-attr]
        best = min(med["restore"], med["recompute"])
        pick = max(set(chosen), key=chosen.count)
        # choice_vs_best: the chosen path's cost (its forced runs) over the best path's: 1.0 when
        # the policy picks the cheaper one.  chosen_ms is the policy's own run, which does the
        # same work as the forced run of its path, plus timing noise
        held = nbytes / slots * history
        paged: dict[str, Any] = {}
        for size in (BLOCK, 2 * BLOCK):  # the pool's block, and twice it
            pool_bytes, warm_slots = pool_held(engine, sid, size, device)
            tag = "" if size == BLOCK else f"_{size}"
            paged[f"pool_bytes{tag}"] = pool_bytes
            paged[f"pool_over_held{tag}"] = round(pool_bytes / (nbytes / slots * warm_slots), 3)
        return {"preset": preset, "dtype": str(dtype).removeprefix("torch."), "device": device,
                "history_tokens": history, "warm_ms": round(med["warm"], 2),
                "restore_ms": round(med["restore"], 2), "recompute_ms": round(med["recompute"], 2),
                "chosen": pick, "chosen_ms": round(med["auto"], 2),
                "choice_vs_best": round(med[pick] / best, 3), "chosen_ms_vs_best": round(med["auto"] / best, 3),
                "kv_bytes": nbytes,
                "kv_bytes_per_token": round(nbytes / slots, 1),
                "raw_get_mb_s": round(statistics.median(raw) / 1e6, 1),
                "restore_mb_s": round(statistics.median(rest) / 1e6, 1),
                "restore_fraction_of_raw": round(statistics.median(rest) / statistics.median(raw), 3),
                "recompute_over_restore": round(med["recompute"] / med["restore"], 2),
                # the worker's pool: a static row of the whole context per warm session (before
                # it was paged), and the paged pool's blocks, against the bytes of the tokens held
                "pool_row_bytes": pool_row_bytes(model.cfg, dtype),
                "pool_row_over_held": round(pool_row_bytes(model.cfg, dtype) / held, 2),
                **paged}
    finally:
        _drop(engine)


def commit_overhead(settings: Settings, client: Any, repeats: int) -> dict[str, float]:
    """64-token AR turns on the shipped shape after a 256-token history: K/V written behind the
    decoding (the engine's default batch of 64 slots) vs all at the turn's end, turns of the two
    interleaved.  Per-step decode time with and without the writes running beside it, and what
    is left for the turn's end."""
    torch.manual_seed(0)
    model = SetDLM(PRESETS["small"]).eval()
    engines: dict[str, Engine] = {}
    sids: dict[str, str] = {}
    runs: dict[str, dict[str, list[float]]] = {}
    try:
        for name, wb in (("end", 0), ("behind", Engine.WRITE_BEHIND)):
            s = settings.model_copy(update={"key_prefix": f"sfbench-{secrets.token_hex(4)}"})
            engines[name] = Engine(model, SessionStore(client, s), Records(make_engine(s)), s, write_behind=wb)
            sids[name] = engines[name].open("bench")
            engines[name].run_turn(sids[name], "bench", list(range(16, 272)), DecodeParams(policy="ar", max_new_tokens=4))
            runs[name] = {"decode": [], "store": [], "sql": []}
        for _ in range(max(9, 3 * repeats)):
            for name, engine in engines.items():
                r = engine.run_turn(sids[name], "bench", [10, 11, 12, 13], COMMIT_TURN)
                for k in ("decode", "store", "sql"):
                    runs[name][k].append(r.costs[f"{k}_s"])
    finally:
        for engine in engines.values():
            _drop(engine)
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in runs.items()}
    steps = COMMIT_TURN.max_new_tokens
    return {"decode_ms_per_step_without_writes": round(med["end"]["decode"] / steps * 1000, 3),
            "decode_ms_per_step_with_writes_behind": round(med["behind"]["decode"] / steps * 1000, 3),
            "per_step_overhead": round(med["behind"]["decode"] / med["end"]["decode"] - 1, 4),
            "end_of_turn_store_ms_behind": round(med["behind"]["store"] * 1000, 2),
            "end_of_turn_store_ms_all_at_end": round(med["end"]["store"] * 1000, 2),
            "sql_ms_per_turn": round(med["end"]["sql"] * 1000, 2)}


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the small preset, histories 256 and 1024, once: < 1 min")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as in a worker)")
    ap.add_argument("--presets", default=None, help=f"comma-separated subset of {','.join([*PRESETS, *REALISTIC])} "
                    "(default: small,wide; quick: small)")
    ap.add_argument("--histories", default=None, help="comma-separated history lengths (default 256,1024,4096; "
                                                       "realistic shapes 256,1024,2048)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--no-overhead", action="store_true", help="skip the commit-overhead rows")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    presets = tuple(args.presets.split(",")) if args.presets else QUICK["presets"] if args.quick else tuple(PRESETS)
    unknown = [p for p in presets if p not in PRESETS and p not in REALISTIC]
    if unknown:
        ap.error(f"unknown presets {unknown}")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    repeats = QUICK["repeats"] if args.quick else args.repeats
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sfb") as tmp:
        settings = Settings(data_dir=Path(tmp), max_input_tokens=max(HISTORIES),
                            session_budget_bytes=1024 * 2**20, tenant_budget_bytes=4096 * 2**20)
        if any(p in REALISTIC for p in presets):  # 2048 tokens of 224 KiB: 448 MiB a session in fp32
            settings = settings.model_copy(update={"session_budget_bytes": 2048 * 2**20,
                                                   "tenant_budget_bytes": 8192 * 2**20})
        client, server = connect(settings)
        try:
            where = settings.redis_url or f"embedded ({server.url if server else '?'})"
            print(f"resume benchmark: Redis {where}; threads {args.threads}; medians of {repeats}", flush=True)
            print(f"{'preset':>10} {'hist':>5} {'warm ms':>8} {'restore':>8} {'recomp':>8} {'chosen':>10} "
                  f"{'ms':>8} {'KV B/tok':>9} {'raw MB/s':>9} {'rest MB/s':>9} {'frac':>6} {'row/held':>8} "
                  f"{'pool/held':>9}", flush=True)
            rows = []
            for preset in presets:
                histories = (tuple(int(h) for h in args.histories.split(",")) if args.histories
                             else QUICK["histories"] if args.quick
                             else REALISTIC_HISTORIES if preset in REALISTIC else HISTORIES)
                model = model_of(preset, dtype, args.device)
                for h in histories:
                    r = measure(preset, h, repeats, settings, client, dtype, args.device, model)
                    rows.append(r)
                    print(f"{preset:>10} {h:>5} {r['warm_ms']:>8} {r['restore_ms']:>8} {r['recompute_ms']:>8} "
                          f"{r['chosen']:>10} {r['chosen_ms']:>8} {r['kv_bytes_per_token']:>9} "
                          f"{r['raw_get_mb_s']:>9} {r['restore_mb_s']:>9} {r['restore_fraction_of_raw']:>6} "
                          f"{r['pool_row_over_held']:>8} {r['pool_over_held']:>9}",
                          flush=True)
            overhead = {} if args.no_overhead else commit_overhead(settings, client, repeats)
            print(f"commit overhead (64-token AR turns, small shape, writes behind vs at the end): {overhead}",
                  flush=True)
        finally:
            if server is not None:
                server.stop()
    result = {"bench": "resume", "rows": rows, "commit_overhead": overhead, "dtype": args.dtype, "device": args.device,
              "threads": args.threads, "repeats": repeats, "wall_s": round(time.perf_counter() - t_start, 1)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
