"""The `setflow` console script: `demo`, `bench decode [args...]`, `train --preset P --steps N --out DIR`.

Imports torch and the model only inside the subcommands, so `setflow --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"  # not a package: found via the checkout


class CliError(Exception):
    """Bad input: main prints it as one line and exits 2."""


def _bench_main(name: str) -> Callable[..., dict[str, Any]]:
    path = BENCH_DIR / f"{name}.py"
    if not path.is_file():
        raise CliError(f"{path} not found: the benchmarks run from a source checkout")
    spec = importlib.util.spec_from_file_location(f"setflow_bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module.main  # type: ignore[no-any-return]


def cmd_demo(args: argparse.Namespace) -> int:
    print("setflow demo (for now): the decoding benchmark's quick mode.\n"
          "It trains a tiny set-diffusion model on arithmetic progressions (or reuses the one cached\n"
          "in .cache/bench-toy/), then decodes with three policies: ar (one token per forward), block\n"
          "and set (per forward, the most confident of W masked positions plus every one whose\n"
          "confidence is >= tau), each with the KV cache and without it.  Fewer forwards per token and\n"
          "more tokens/s at the same accuracy are the point of set decoding.\n", flush=True)
    _bench_main("decode")(["--quick"], prog="setflow bench decode")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    _bench_main(args.name)(args.args, prog=f"setflow bench {args.name}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from model.config import PRESETS, ModelConfig
    from model.corpus import toy

    if args.steps < 1:
        raise CliError(f"--steps must be >= 1, got {args.steps}")
    if args.preset not in PRESETS:
        raise CliError(f"unknown preset {args.preset!r}; known: {', '.join(sorted(PRESETS))}")
    cfg = ModelConfig.from_name(args.preset)

    from model.train import TrainConfig, train  # imports torch: only once the input is known good

    tc = TrainConfig(steps=args.steps, seed=args.seed, **toy.RECIPE)  # type: ignore[arg-type]
    # train() resumes from args.out when it holds a trainer state, and checkpoints into it
    try:
        _, losses = train(cfg, toy.batches(args.seed, tc.batch_size, tc.seq_len), tc, out=args.out)
    except ValueError as e:  # e.g. args.out holds a checkpoint of another config
        raise CliError(str(e)) from e
    tail = losses[-tc.log_every:]
    print(f"{args.preset}: step {len(losses)}, mean loss of the last {len(tail)} steps "
          f"{sum(tail) / max(len(tail), 1):.4f}; checkpoint in {args.out}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="setflow", description="A runtime for a set-diffusion language model.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="run the decoding benchmark's quick mode, with an explanation")
    demo.set_defaults(func=cmd_demo)
    bench = sub.add_parser("bench", help="run a benchmark: bench decode [--quick] [--repeats N] ...")
    bench.add_argument("name", choices=["decode"])
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed on to bench/<name>.py")
    bench.set_defaults(func=cmd_bench)
    tr = sub.add_parser("train", help="train a preset on the toy corpus (resumes from --out)")
    tr.add_argument("--preset", default="toy", help="model preset (default: toy)")
    tr.add_argument("--steps", type=int, required=True, help="total optimiser steps")
    tr.add_argument("--out", type=Path, required=True, help="checkpoint folder; resumed when it holds a trainer state")
    tr.add_argument("--seed", type=int, default=0, help="data and initialisation seed (default 0)")
    tr.set_defaults(func=cmd_train)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as e:
        print(f"setflow: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
