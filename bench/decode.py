"""Decoding benchmark: the ar, block and set policies on one toy model, with and without the KV cache.

Trains the `toy` preset on the toy corpus (or loads it from .cache/bench-toy/<key>/, keyed by the
config, the recipe, the corpus and the training code), then reports per (policy, W, tau, cached): decode forwards per generated
token, tokens/s (median over repeats), wall time and exact-match accuracy.  Prints a table, then
one JSON object as the last line.   python bench/decode.py [--quick] [--repeats N] [--threads N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root (bench/ too), as a script

import torch

from model import checkpoint
from model.config import ModelConfig
from model.corpus import toy
from model.decode import generate
from model.params import DecodeParams
from model.train import TrainConfig, train
from model.transformer import SetDLM

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "bench-toy"
TRAIN = TrainConfig(steps=250, seed=0, **toy.RECIPE)  # type: ignore[arg-type]
WEIGHT_CODE = ("config", "transformer", "masks", "order", "train", "checkpoint")  # model/*.py
EVAL_SEED = 1  # prompts come from a stream the training batches never draw from
TAUS = (0.5, 0.7, 0.9, None)  # None = off: exactly one token per step
HEADLINE = ("set", 4, 0.9)  # the reference's headline setting: W = d = 4, tau = 0.9
SHORT, LONG = 64, 256  # new tokens: the main grid; the full mode's cached-vs-uncached rows


@dataclass(frozen=True)
class Spec:
    policy: str
    W: int
    tau: float | None
    cached: bool
    new_tokens: int
    eos_stop: bool  # False: decode exactly new_tokens positions, whatever the model emits


def grid(quick: bool) -> list[Spec]:
    specs = [("ar", 1, None)] + [(p, W, tau) for p in ("block", "set") for W in (4, 8) for tau in TAUS]
    rows = [Spec(p, W, tau, cached, SHORT, True) for p, W, tau in specs for cached in (True, False)]
    if not quick:
        # The cache's payoff grows with length.  The toy model drifts off the progression (and
        # may emit EOS) some way past its 64-token training window, so these rows decode exactly
        # LONG tokens with ignore_eos=True (the same generate() path, EOS just does not stop it).
        rows += [Spec(p, W, tau, cached, LONG, False) for p, W, tau in [("ar", 1, None), HEADLINE]
                 for cached in (True, False)]
    return rows


def trained_model() -> tuple[SetDLM, dict[str, Any]]:
    """The toy model for TRAIN's settings: from the cache folder, or trained (and cached) now."""
    cfg = ModelConfig.from_name("toy")
    # keyed by everything that shapes the weights: config, recipe, corpus and the code that trains
    model_dir = Path(checkpoint.__file__).parent
    sources = [Path(toy.__file__)] + [model_dir / f"{name}.py" for name in WEIGHT_CODE]
    key_src = [cfg.to_json(), json.dumps(asdict(TRAIN), sort_keys=True)] + [p.read_text() for p in sources]
    folder = CACHE / hashlib.sha256("\n".join(key_src).encode()).hexdigest()[:16]
    if (folder / "bench.json").exists():
        return checkpoint.load(folder), {**json.loads((folder / "bench.json").read_text()), "from_cache": True}
    t0 = time.perf_counter()
    model, losses = train(cfg, toy.batches(TRAIN.seed, TRAIN.batch_size, TRAIN.seq_len), TRAIN,
                          progress=sys.stderr.isatty())
    meta = {"train_s": round(time.perf_counter() - t0, 1), "train_threads": torch.get_num_threads(),
            "final_loss": round(sum(losses[-10:]) / 10, 4), **asdict(TRAIN)}
    with checkpoint.atomic_folder(folder) as tmp:  # an interrupted run leaves no half-written model
        checkpoint.save(model, tmp)
        (tmp / "bench.json").write_text(json.dumps(meta))
    return model, {**meta, "from_cache": False}


@torch.no_grad()
def run_one(model: SetDLM, prompt: list[int], params: DecodeParams) -> tuple[list[int], int]:
    """Generated ids and the number of decode forwards: every forward but the prompt prefill
    (a stop's rollback re-commit, when one happens, counts)."""
    out, _, state = generate(model, prompt, params)
    return out, state.nfe - 1


def measure(model: SetDLM, prompts: list[list[int]], spec: Spec, repeats: int) -> dict[str, Any]:
    params = DecodeParams(policy=spec.policy, window=spec.W, tau=spec.tau, max_new_tokens=spec.new_tokens,
                          use_cache=spec.cached, ignore_eos=not spec.eos_stop)
    walls = []
    for _ in range(repeats):  # greedy decoding: every repeat produces the same outputs
        t0 = time.perf_counter()
        runs = [run_one(model, p, params) for p in prompts]
        walls.append(time.perf_counter() - t0)
    n_tokens = sum(len(out) for out, _ in runs)
    return {**asdict(spec), "prompts": len(prompts), "tokens": n_tokens,
            "nfe_per_token": round(sum(nfe for _, nfe in runs) / n_tokens, 4),
            "tokens_per_s": round(statistics.median(n_tokens / w for w in walls), 1),
            "wall_s": round(statistics.median(walls), 4),
            "accuracy": round(sum(toy.check(p, out) for p, (out, _) in zip(prompts, runs)) / len(prompts), 4)}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Cached over uncached tokens/s at the longest length measured; NFE and accuracy at SHORT."""
    by = {(r["policy"], r["W"], r["tau"], r["cached"], r["new_tokens"]): r for r in rows}
    n = max(r["new_tokens"] for r in rows)
    out: dict[str, Any] = {"ratio_new_tokens": n}
    for name, (p, W, tau) in {"ar": ("ar", 1, None), "set_W4_tau0.9": HEADLINE}.items():
        ratio = by[p, W, tau, True, n]["tokens_per_s"] / by[p, W, tau, False, n]["tokens_per_s"]
        out[f"{name}_cached_over_uncached"] = round(ratio, 2)
        out[f"{name}_nfe_per_token"] = by[p, W, tau, True, SHORT]["nfe_per_token"]
        out[f"{name}_accuracy"] = by[p, W, tau, True, SHORT]["accuracy"]
    return out


# (row key, header, width) of the printed table
COLUMNS = (("policy", "policy", 6), ("W", "W", 2), ("tau", "tau", 4), ("cached", "cached", 6),
           ("new_tokens", "new", 4), ("nfe_per_token", "nfe/tok", 7), ("tokens_per_s", "tok/s", 8),
           ("wall_s", "wall_s", 7), ("accuracy", "acc", 5))


def table_line(row: dict[str, Any] | None) -> str:
    if row is None:
        return "  ".join(f"{head:>{w}}" for _, head, w in COLUMNS)
    return "  ".join(f"{'off' if row[k] is None else row[k]!s:>{w}}" for k, _, w in COLUMNS)


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 prompts x 64 tokens, no 256-token rows: under a minute with training")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per row (default 3 quick, 5 full)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads while timing (training uses all)")
    ap.add_argument("--out-json", type=Path, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 5)
    if repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads must be >= 1")

    model, train_meta = trained_model()
    torch.set_num_threads(args.threads)  # one thread: stable timings on a shared 2-core machine
    stream = toy.examples(EVAL_SEED)
    prompts = [ids[:n] for ids, n in (next(stream) for _ in range(4 if args.quick else 32))]
    run_one(model, prompts[0], DecodeParams(max_new_tokens=16))  # warm-up, untimed

    print(f"toy model: trained {train_meta['steps']} steps in {train_meta['train_s']} s"
          f"{' (loaded from cache)' if train_meta['from_cache'] else ''}; timing threads={args.threads}, "
          f"repeats={repeats}; nfe_per_token excludes the prompt prefill")
    print(table_line(None))
    rows = []
    for spec in grid(args.quick):
        # the LONG rows are costly uncached, and 4 prompts are enough to time them
        rows.append(measure(model, prompts[:4] if spec.new_tokens == LONG else prompts, spec, repeats))
        print(table_line(rows[-1]), flush=True)
    result = {"bench": "decode",
              "model": {"preset": "toy", "fingerprint": checkpoint.fingerprint(model)[:16], **train_meta},
              "threads": args.threads, "repeats": repeats, "rows": rows, "summary": summary(rows)}
    if args.out_json is not None:
        args.out_json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
