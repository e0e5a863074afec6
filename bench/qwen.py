"""Speed at a real model's shape: setflow beside transformers' `generate` on the same weights.

A random-weight Qwen3-0.6B (or 1.7B) checkpoint in the reference's HF layout (bench/checkpoints.py),
imported by model/importer.py (kept under .cache/bench-qwen/ for the next run), and the same
tensors loaded into transformers' Qwen3ForCausalLM.  Per (dtype, threads), alternating setflow
and transformers, medians of --repeats:
  prefill   a --prompt-token prompt (256: the issue's; setflow: K/V only, model/decode.py
            prefill; transformers: one forward with its cache, the last position's logits, as
            generate's first step)
  ar        32 new tokens, greedy, after that prompt: transformers generate (KV cache) vs setflow
            W = 1 (each step a forward over [the last token | one mask]); decode only: each run's
            time less its side's prefill median (transformers' first token comes with its
            prefill: 31 tokens decoded)
  W4, W8    setflow, every window position committed (policy set, tau 0): W tokens a forward,
            decode only as ar
  batch B   setflow, B sessions' AR turns from 16-token prompts in one batched forward a step
            (bench/batch.py batched), prefill included
Beside each row, its bound: per token, max(weight bytes / bandwidth, FLOPs / rate), the bandwidth
that of 1-row products over every weight a forward reads, in turn (as a decode step streams them
from memory; the vocabulary's alone, which a large last-level cache can hold, is printed beside
it) and the rate that of a 256 x 1024 x 3072 product, each the faster of model/rowdot.c and
torch's F.linear, measured in the same run; `of_bound` is the
measured time over it (1.0 = at the bound).  Prints a table, then one JSON line (also --out-json).
With --device cuda (bench/gpu.sh) both run on the GPU, timed to its synchronisation; --threads
is then ignored.  --clock cpu times this process's CPU time instead of the wall's, at one thread
only: on a machine whose cores other work shares, each side's time as if it ran alone (what the
other work takes of the memory's bandwidth still counts).

    python bench/qwen.py [--quick] [--shape qwen3-0.6b|qwen3-1.7b] [--dtypes fp32,bf16] [--device cpu|cuda]
                         [--threads 1,2] [--clock wall|cpu] [--repeats N] [--prompt 256] [--out-json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root (bench/ too), as a script

import torch
import torch.nn.functional as F

from bench.batch import Turn, batched
from bench.checkpoints import SHAPES, write
from model import checkpoint, rowdot
from model.decode import begin_turn, decode, prefill
from model.importer import import_checkpoint
from model.kv_cache import KVCache
from model.linear import served
from model.params import DecodeParams
from model.pool import BLOCK, KVPool
from model.transformer import SetDLM

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench-qwen"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PROMPT, NEW, PREFILL = 16, 32, 256  # a batch's prompts, new tokens, the decode rows' prompt (--prompt)
WINDOWS = (4, 8)
SESSIONS, QUICK_SESSIONS = (1, 4, 8), (1, 8)
TARGETS = {"ar": 1.0, "prefill": 1.0, "W4": 2.5, "W8": 3.0, "batch8": 3.0, "of_bound": 1.5}


def imported(shape: str, seed: int = 0) -> Path:
    """The random-weight checkpoint of `shape`, written in the reference's HF layout (bf16, as
    released) and imported: from the cache folder, or made now."""
    out = CACHE / f"{shape}-seed{seed}"
    if not (out / "config.json").exists():
        src = CACHE / f"{shape}-seed{seed}-src"
        t = time.perf_counter()
        written = write(shape, "hf_safetensors", src, seed=seed)
        import_checkpoint(written["src"], out, name=f"{shape}-random")
        shutil.rmtree(src)  # the import is what is read from now on
        print(f"wrote and imported {shape} in {time.perf_counter() - t:.0f} s", flush=True)
    return out


def hf_model(model: SetDLM) -> Any:
    """transformers' Qwen3ForCausalLM holding the very tensors of `model` (no copy)."""
    import transformers

    c = model.cfg
    cfg = transformers.Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
                                   num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                                   num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim, rope_theta=c.rope_theta,
                                   rms_norm_eps=c.rms_eps, tie_word_embeddings=c.tie_embeddings,
                                   max_position_embeddings=c.max_seq_len, eos_token_id=c.eos_id,
                                   pad_token_id=c.pad_id, bos_token_id=c.bos_id)
    w = next(model.parameters())
    with torch.device("meta"):
        hf = transformers.Qwen3ForCausalLM(cfg)
    state = {("lm_head.weight" if k == "lm_head.weight" else f"model.{k}"): v for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False, assign=True)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if c.tie_embeddings:
        hf.lm_head.weight = hf.model.embed_tokens.weight
    with torch.device(w.device):
        hf.model.rotary_emb = type(hf.model.rotary_emb)(cfg)  # its buffers, built off meta
    assert not any(p.is_meta for p in hf.parameters()), "a transformers weight was not loaded"
    return hf.to(w.dtype).eval()


# ---- the bound ------------------------------------------------------------------------------------

#: what clock() reads: "wall" (perf_counter), or "cpu" (this process's CPU time: at one thread
#: the wall time of an idle machine, whatever else shares the cores; --clock)
CLOCK = {"kind": "wall"}


def clock() -> float:
    """Seconds, after the GPU (if any) has finished what was queued: a timer's reading (CLOCK)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.process_time() if CLOCK["kind"] == "cpu" else time.perf_counter()


def best_s(fn: Callable[[], object], reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = clock()
        fn()
        times.append(clock() - t)
    return min(times)


@torch.no_grad()
def machine(model: SetDLM, dtype: torch.dtype) -> dict[str, float]:
    """Bytes/s of 1-row products over every weight a forward reads, in turn (each layer's and the
    vocabulary's: more bytes than a last-level cache holds, as a decode step streams them), and
    FLOP/s of a 256 x 1024 x 3072 product, each the faster of rowdot and F.linear, at the current
    threads.  (A 1-row product over the vocabulary's weights alone, repeated, can run from a
    last-level cache as large as 480 MB: kept beside it as bandwidth_vocab_gb_s, not the bound.)"""
    weights = list({m.weight.data_ptr(): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}.values())
    xs = {w.shape[1]: torch.randn(1, w.shape[1]).to(dtype).to(w.device) for w in weights}
    total = sum(w.numel() * w.element_size() for w in weights)
    vocab = model.lm_head.weight  # (V, d)
    big_w = torch.randn(3072, 1024).to(dtype).to(vocab.device)
    big_x = torch.randn(256, 1024).to(dtype).to(vocab.device)
    th = torch.get_num_threads()
    vbytes = vocab.numel() * vocab.element_size()
    bw = {"torch": total / best_s(lambda: [F.linear(xs[w.shape[1]], w) for w in weights], 3)}
    bw_vocab = {"torch": vbytes / best_s(lambda: F.linear(xs[vocab.shape[1]], vocab))}
    rate = {"torch": 2 * 256 * 1024 * 3072 / best_s(lambda: F.linear(big_x, big_w), 3)}
    if served(dtype) and vocab.device.type == "cpu":
        packed = {w.data_ptr(): rowdot.pack(w) if rowdot.packs(dtype) else None for w in weights}  # as layers keep them
        pbig = rowdot.pack(big_w) if rowdot.packs(dtype) else None
        bw["rowdot"] = total / best_s(lambda: [rowdot.product(xs[w.shape[1]], w, th, packed=packed[w.data_ptr()])
                                               for w in weights], 3)
        bw_vocab["rowdot"] = vbytes / best_s(lambda: rowdot.product(xs[vocab.shape[1]], vocab, th,
                                                                    packed=packed[vocab.data_ptr()]))
        rate["rowdot"] = 2 * 256 * 1024 * 3072 / best_s(lambda: rowdot.product(big_x, big_w, th, packed=pbig), 3)
    return {"bandwidth_gb_s": round(max(bw.values()) / 1e9, 2), "rate_gflop_s": round(max(rate.values()) / 1e9, 1),
            "bandwidth_vocab_gb_s": round(max(bw_vocab.values()) / 1e9, 2),
            **{f"bandwidth_{k}_gb_s": round(v / 1e9, 2) for k, v in bw.items()},
            **{f"rate_{k}_gflop_s": round(v / 1e9, 1) for k, v in rate.items()}}


def forward_bound_s(model: SetDLM, rows: int, logit_rows: int, keys: int, hw: dict[str, float]) -> float:
    """A forward of `rows` tokens over `keys` keys each, `logit_rows` of them projected to the
    vocabulary: max(the weights it reads / bandwidth, its FLOPs / rate)."""
    c = model.cfg
    esz = next(model.parameters()).element_size()
    layer = sum(m.weight.numel() for m in model.layers[0].modules() if isinstance(m, torch.nn.Linear))
    vocab = c.vocab_size * c.d_model
    nbytes = esz * (c.n_layers * layer + (vocab if logit_rows else 0))
    flops = 2 * (rows * c.n_layers * layer + logit_rows * vocab) + 4 * rows * keys * c.n_heads * c.head_dim * c.n_layers
    return max(nbytes / (hw["bandwidth_gb_s"] * 1e9), flops / (hw["rate_gflop_s"] * 1e9))


# ---- the rows -------------------------------------------------------------------------------------

def prompt_ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 150_000, (n,), generator=g).tolist()


@torch.no_grad()
def setflow_prefill(model: SetDLM, ids: list[int]) -> float:
    w = next(model.parameters())
    cache = KVCache.for_model(model.cfg, capacity=len(ids) + 16, dtype=w.dtype, device=w.device)
    t = clock()
    prefill(model, cache, ids, list(range(len(ids))))
    return clock() - t


@torch.no_grad()
def hf_prefill(hf: Any, ids: list[int]) -> float:
    t = clock()
    hf(torch.tensor([ids], device=hf.device), use_cache=True, logits_to_keep=1)
    return clock() - t


@torch.no_grad()
def setflow_decode(model: SetDLM, ids: list[int], params: DecodeParams) -> tuple[float, int, int]:
    """Decode only, timed on its own after the prompt's prefill: seconds, new tokens, forwards
    (the prefill's not counted)."""
    w = next(model.parameters())
    cache = KVCache.for_model(model.cfg, capacity=len(ids) + params.max_new_tokens + 2 * params.window,
                              dtype=w.dtype, device=w.device)
    state = begin_turn(model, cache, None, ids, params)  # the prompt's prefill, untimed
    nfe, t = state.nfe, clock()
    for _ in decode(model, cache, state, params):
        pass
    return clock() - t, len(state.tokens) - len(ids), state.nfe - nfe


@torch.no_grad()
def hf_decode(hf: Any, ids: list[int], n: int) -> tuple[float, int, int]:
    """Decode only, as setflow's: the prompt but its last token prefilled untimed, then
    `generate` from that cache (the last prompt token's forward gives the first new token):
    seconds, new tokens, forwards."""
    past = hf(torch.tensor([ids[:-1]], device=hf.device), use_cache=True, logits_to_keep=1).past_key_values
    t = clock()
    out = hf.generate(torch.tensor([ids], device=hf.device), cache=past, max_new_tokens=n,
                      min_new_tokens=n, do_sample=False, use_cache=True)
    return clock() - t, out.shape[1] - len(ids), n


def setflow_batch(model: SetDLM, pool: KVPool, prompts: list[list[int]]) -> tuple[float, int, int]:
    params = DecodeParams(policy="ar", max_new_tokens=NEW, ignore_eos=True)
    t = clock()
    p = batched(model, pool, [[Turn(ids, params)] for ids in prompts])
    return clock() - t, sum(len(w) for w in p.written), p.forwards


def measure(model: SetDLM, hf: Any, dtype: str, threads: int, repeats: int, sessions: tuple[int, ...],
            hw: dict[str, float], prompt: int = PREFILL) -> list[dict[str, Any]]:
    """The rows of one (dtype, threads): each case's runs alternate with its baseline's; the
    decode rows (ar, ar_hf, W) time decode only, each run after its own untimed prefill."""
    cfg = model.cfg
    long_prompt = prompt_ids(prompt, 1)
    pool = KVPool(cfg, max(sessions) * -(-(PROMPT + NEW + 16) // BLOCK) + 8, dtype=DTYPES[dtype],
                  device=next(model.parameters()).device)
    cases: dict[str, Callable[[], tuple[float, int, int]]] = {
        "prefill": lambda: (setflow_prefill(model, long_prompt), prompt, 1),
        "prefill_hf": lambda: (hf_prefill(hf, long_prompt), prompt, 1),
        "ar": lambda: setflow_decode(model, long_prompt, DecodeParams(policy="ar", max_new_tokens=NEW, ignore_eos=True)),
        "ar_hf": lambda: hf_decode(hf, long_prompt, NEW),
        **{f"W{W}": (lambda W=W: setflow_decode(model, long_prompt, DecodeParams(  # type: ignore[misc]
            policy="set", window=W, tau=0.0, max_new_tokens=NEW, ignore_eos=True))) for W in WINDOWS},
        **{f"batch{B}": (lambda B=B: setflow_batch(model, pool, [prompt_ids(PROMPT, 10 + i)  # type: ignore[misc]
                                                                   for i in range(B)])) for B in sessions},
    }
    for fn in cases.values():  # warm-up, untimed (the kernel's build, transformers' first call)
        fn()
    runs: dict[str, list[tuple[float, int, int]]] = {k: [] for k in cases}
    for _ in range(repeats):
        for k, fn in cases.items():
            runs[k].append(fn())
    rows = []
    for k, rs in runs.items():
        secs = statistics.median(r[0] for r in rs)
        tokens, fwd = rs[0][1], rs[0][2]
        rows.append({"dtype": dtype, "threads": threads, "case": k, "tokens": tokens, "forwards": fwd,
                     "seconds": round(secs, 4), "tokens_per_s": round(tokens / secs, 2),
                     "bound_s": round(bound_s(model, k, tokens, hw, prompt), 4)})
        rows[-1]["of_bound"] = round(secs / rows[-1]["bound_s"], 2)
    return rows


def bound_s(model: SetDLM, case: str, tokens: int, hw: dict[str, float], prompt: int = PREFILL) -> float:
    """The bound of what a case's row times: the sum of its forwards' bounds (each token's keys
    taken at the run's middle length); a decode row's, its decode's forwards only."""
    f = lambda rows, logits, keys: forward_bound_s(model, rows, logits, keys, hw)  # noqa: E731
    if case.startswith("prefill"):
        return f(prompt, 0 if case == "prefill" else 1, prompt // 2)
    if case.startswith("batch"):
        B = int(case.removeprefix("batch"))
        return f(B * PROMPT, 0, PROMPT // 2) + NEW * f(2 * B, B, PROMPT + NEW // 2)  # one batched prefill, then steps
    keys = prompt + NEW // 2
    if case == "ar_hf":  # a 1-row forward per token (the first from the last prompt token)
        return tokens * f(1, 1, keys)
    W = 1 if case == "ar" else int(case.removeprefix("W"))
    return -(-NEW // W) * f(2 * W, W, keys)  # every step commits W: its pending W and W masks


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (dtype, threads): setflow over transformers (prefill, ar), W over transformers' AR,
    8 sessions over one, the worst of_bound of setflow's rows; each beside its target."""
    out: dict[str, Any] = {}
    for key in sorted({(r["dtype"], r["threads"]) for r in rows}):
        by = {r["case"]: r for r in rows if (r["dtype"], r["threads"]) == key}
        tps = {k: r["tokens_per_s"] for k, r in by.items()}
        got = {"prefill": tps["prefill"] / tps["prefill_hf"], "ar": tps["ar"] / tps["ar_hf"],
               **{f"W{W}": tps[f"W{W}"] / tps["ar_hf"] for W in WINDOWS},
               "of_bound": max(r["of_bound"] for k, r in by.items() if not k.endswith("_hf"))}
        if "batch8" in tps:
            got["batch8"] = tps["batch8"] / tps["batch1"]
        out[f"{key[0]}_t{key[1]}"] = {k: {"got": round(v, 2), "target": TARGETS[k],
                                          "met": v <= TARGETS[k] if k == "of_bound" else v >= TARGETS[k]}
                                      for k, v in got.items()}
    return out


def table_line(r: dict[str, Any] | None) -> str:
    cols = (("dtype", 5), ("threads", 7), ("case", 10), ("tokens", 6), ("forwards", 8), ("seconds", 8),
            ("tokens_per_s", 12), ("bound_s", 8), ("of_bound", 8))
    if r is None:
        return "  ".join(f"{k:>{w}}" for k, w in cols)
    return "  ".join(f"{r[k]!s:>{w}}" for k, w in cols)


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat, sessions 1 and 8: a few minutes")
    ap.add_argument("--shape", choices=[s for s in SHAPES if s != "tiny"], default="qwen3-0.6b")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--threads", default="1,2", help="torch threads (and rowdot's), each in turn (CPU)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per case (default 3; 1 with --quick)")
    ap.add_argument("--prompt", type=int, default=PREFILL, help="the prefill's and the decode rows' prompt, tokens")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall time, or this process's CPU time (for one thread on a shared machine)")
    ap.add_argument("--out-json", type=Path)
    args = ap.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    try:
        threads = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--threads: comma-separated counts, got {args.threads!r}")
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if any(d not in DTYPES for d in dtypes) or not threads or min(threads) < 1 or repeats < 1 or args.prompt < 1:
        ap.error("--dtypes of fp32,bf16; --threads, --repeats and --prompt >= 1")
    sessions = QUICK_SESSIONS if args.quick else SESSIONS
    if args.device == "cuda":
        if not torch.cuda.is_available():
            ap.error("--device cuda: no CUDA device here")
        threads = [torch.get_num_threads()]
    if args.clock == "cpu" and (args.device == "cuda" or max(threads) > 1):
        ap.error("--clock cpu times one CPU thread: with more, or a GPU, CPU time is not the wall's")
    CLOCK["kind"] = args.clock
    warnings.filterwarnings("ignore")  # transformers' generation-config notices
    folder = imported(args.shape)
    kernel = torch.cuda.get_device_name() if args.device == "cuda" else rowdot.name() or "none (padded BLAS)"
    print(f"{args.shape}: {args.device}, kernel {kernel}, cpus {os.cpu_count()}, "
          f"load {os.getloadavg()[0]:.1f}; medians of {repeats}, {args.clock} clock", flush=True)
    print(table_line(None))
    rows, machines = [], {}
    for dtype in dtypes:
        model = checkpoint.load(folder, dtype=DTYPES[dtype]).to(args.device)
        hf = hf_model(model)
        for th in threads:
            torch.set_num_threads(th)
            hw = machine(model, DTYPES[dtype])
            machines[f"{dtype}_t{th}"] = hw
            for r in measure(model, hf, dtype, th, repeats, sessions, hw, args.prompt):
                rows.append(r)
                print(table_line(r), flush=True)
            print(f"  {dtype}, {th} thread(s): bandwidth {hw['bandwidth_gb_s']} GB/s (the vocabulary's alone "
                  f"{hw['bandwidth_vocab_gb_s']}), rate {hw['rate_gflop_s']} GFLOP/s, load {os.getloadavg()[0]:.1f}",
                  flush=True)
        del model, hf
    result = {"bench": "qwen", "shape": args.shape, "device": args.device, "kernel": kernel, "repeats": repeats, "prompt": args.prompt,
              "clock": args.clock,
              "load_avg_end": round(os.getloadavg()[0], 2), "machine": machines, "rows": rows,
              "summary": summary(rows)}
    for k, v in result["summary"].items():
        print(f"{k}: " + ", ".join(f"{m} {s['got']} ({'ok' if s['met'] else 'short of'} {s['target']})"
                                   for m, s in v.items()))
    if args.out_json is not None:
        args.out_json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
