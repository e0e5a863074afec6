"""The `setflow` console script: `demo [--serve]`, `serve`, `worker`, `submit KIND SPEC`, `answer`, `tour`,
`bench decode|quality|resume|load [args...]`, `train --preset P --out DIR`, `import SRC --out DIR
[--dry-run]`.

Imports torch and the model only inside the subcommands, so `setflow --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.errors import CliError

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"  # not a package: found via the checkout


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
    from app.demo import run_demo

    return run_demo(serve=args.serve, port=args.port)


def cmd_tour(args: argparse.Namespace) -> int:
    from app.tour import run_tour  # imports torch and the model

    run_tour()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from app.serve import serve

    return serve(args.host, args.port)


def cmd_submit(args: argparse.Namespace) -> int:
    from app.submit import submit

    return submit(args)


def cmd_answer(args: argparse.Namespace) -> int:
    from app.submit import answer

    return answer(args)


def cmd_bench(args: argparse.Namespace) -> int:
    _bench_main(args.name)(args.args, prog=f"setflow bench {args.name}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from model.config import PRESETS, ModelConfig

    if args.until is not None and args.until < 1:
        raise CliError(f"--until must be >= 1, got {args.until}")
    if args.steps is not None and args.steps < 1:
        raise CliError(f"--steps must be >= 1, got {args.steps}")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        raise CliError(f"--lr must be a finite number > 0, got {args.lr}")
    if args.preset not in PRESETS or args.preset == "test":
        raise CliError(f"unknown or untrainable preset {args.preset!r}; trainable: toy, small")
    cfg = ModelConfig.from_name(args.preset)
    if args.init is not None and not (args.init / "config.json").is_file():
        raise CliError(f"--init {args.init}: not a checkpoint folder (no config.json)")
    mix = None
    if args.mix is not None:
        from model.corpus.mixture import parse_mix

        if args.init is None or args.preset != "small":
            raise CliError("--mix sets a fine-tune's shares: it needs --preset small and --init")
        try:
            mix = parse_mix(args.mix)
        except ValueError as e:
            raise CliError(f"--mix {e}") from e
    if args.wild is not None and (args.init is None or args.preset != "small"):
        raise CliError("--wild sets a fine-tune's share of the API's grammar: it needs --preset small and --init")
    if args.wild is not None and not 0 <= args.wild <= 1:
        raise CliError(f"--wild must be a share in [0, 1], got {args.wild}")
    if args.slip and (args.init is None or args.preset != "small"):
        raise CliError("--slip sets a fine-tune's share of mended calls: it needs --preset small and --init")
    if not 0 <= args.slip <= 1:
        raise CliError(f"--slip must be a share in [0, 1], got {args.slip}")
    if args.drivers and (args.init is None or args.preset != "small"):
        raise CliError("--drivers sets a fine-tune's share of narratives with drivers: it needs --preset small and --init")
    if not 0 <= args.drivers <= 1:
        raise CliError(f"--drivers must be a share in [0, 1], got {args.drivers}")

    # imports torch: only once the input is known good
    from model import checkpoint
    from model.train import TrainConfig, train

    if (args.out / "trainer.json").exists() and checkpoint.load_config(args.out) != cfg:
        raise CliError(f"{args.out} holds a checkpoint of another model config; cannot resume it as {args.preset!r}")

    make_batches: Callable[[int, int, int], Any]
    data: dict[str, Any] = {"seed": args.seed}
    fresh: list[int] = []  # token ids new to the init's vocabulary
    if args.preset == "toy":
        from model.corpus import toy
        recipe: dict[str, Any] = dict(steps=250, **toy.RECIPE)
        tokenizer_json = None
        make_batches = toy.batches
    else:  # the shipped model: the three use-case corpora, and a tokenizer learnt from them
        from domain.markup import SLOT_TOKENS
        from model.corpus import mixture
        from model.tokenizer import Tokenizer
        recipe = dict(mixture.FINETUNE if args.init is not None else mixture.RECIPE)
        saved = args.out / checkpoint.TOKENIZER
        # a resumed run keeps the tokenizer its weights were trained with; a fine-tune its base's
        if (args.out / "trainer.json").exists() and saved.exists():
            tok = Tokenizer.from_file(saved)
        elif args.init is not None:  # the fact slots added after its last id where it lacks them
            base = Tokenizer.from_file(args.init / checkpoint.TOKENIZER)
            tok = base.with_tokens(SLOT_TOKENS)
            fresh = list(range(base.vocab_size, tok.vocab_size))
        else:
            tok = mixture.train_tokenizer()
        if tok.vocab_size > cfg.vocab_size:
            raise CliError(f"the corpora's tokenizer has {tok.vocab_size} tokens > the preset's {cfg.vocab_size}")
        tokenizer_json = tok.to_str()

        def make_batches(seed: int, batch_size: int, seq_len: int) -> Any:
            return mixture.batches(tok, seed, batch_size, seq_len, finetune=args.init is not None, mix=mix,
                                    wild=args.wild, slip=args.slip, drivers=args.drivers)
        if args.init is not None:  # what makes a fine-tune's data stream: a resume must give the same
            data = {"seed": args.seed, "mix": mix or mixture.FINETUNE_MIX,
                    "wild": mixture.WILD if args.wild is None else args.wild}
            if args.slip:  # absent at 0: a run from before --slip resumes as it was
                data["slip"] = args.slip
            if args.drivers:  # so too --drivers
                data["drivers"] = args.drivers
    if args.steps is not None:
        recipe["steps"] = args.steps
    if args.lr is not None:
        recipe["lr"] = args.lr
    tc = TrainConfig(seed=args.seed, **recipe)
    print(f"training {args.preset}: {tc.steps} steps of {tc.batch_size} examples "
          f"into {args.out} (resumes from it when it holds a trainer state)", flush=True)
    try:
        _, losses = train(cfg, make_batches(args.seed, tc.batch_size, tc.seq_len), tc, out=args.out,
                          tokenizer_json=tokenizer_json, init=args.init, data=data, fresh_ids=fresh, until=args.until)
    except ValueError as e:  # e.g. args.out holds a checkpoint of another config
        raise CliError(str(e)) from e
    tail = losses[-tc.log_every:]
    print(f"{args.preset}: step {len(losses)}, mean loss of the last {len(tail)} steps "
          f"{sum(tail) / max(len(tail), 1):.4f}; checkpoint in {args.out}")
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    for f in args.src:
        if not (f / "config.json").is_file():
            raise CliError(f"{f}: not a checkpoint folder (no config.json)")
    from model import checkpoint  # imports torch: only once the input is known good

    try:
        checkpoint.average(args.src, args.out)
    except ValueError as e:
        raise CliError(str(e)) from e
    print(f"the mean of {len(args.src)} checkpoints' weights in {args.out}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from model.importer import ImportRefused, import_checkpoint, plan_import  # imports torch

    if not args.dry_run and args.out is None:
        raise CliError("--out DIR is required (or --dry-run)")
    opts = dict(config=args.config, base_config=args.base_config, tokenizer=args.tokenizer, name=args.name)
    try:
        if args.dry_run:
            plan, _ = plan_import(args.src, **opts)
            print("\n".join(plan.lines()))
            print("importable" if plan.ok else "not importable as it is")
            return 0 if plan.ok else 2
        plan = import_checkpoint(args.src, args.out, **opts)
    except ImportRefused as e:
        raise CliError(f"{e.code}: {e}") from e
    assert plan.config is not None
    cfg = plan.config
    print(f"imported {args.src} -> {args.out}: {cfg.n_layers} layers, d_model {cfg.d_model}, vocab {cfg.vocab_size}, "
          f"mask id {cfg.mask_id}, eos id {cfg.eos_id}; {len(plan.mapped)} tensors, {len(plan.dropped)} dropped")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.launch import launch  # imports Celery (and torch only to count GPUs)

    return launch(args.name, args.processes, args.loglevel)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="setflow", description="A runtime for a set-diffusion language model.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="the product end to end: embedded Redis + SQLite, the API, a worker; a report "
                          "job with progress, a two-question agent session, the web page")
    demo.add_argument("--serve", action="store_true", help="keep the API and the worker running (Ctrl-C stops)")
    demo.add_argument("--port", type=int, default=None, help="the API's port (default: SETFLOW_API_PORT, 8000)")
    demo.set_defaults(func=cmd_demo)
    tour = sub.add_parser("tour", help="the shipped model in this process: a narrative (AR vs set decoding), an "
                          "agent, a template, a session resumed from Redis")
    tour.set_defaults(func=cmd_tour)
    sv = sub.add_parser("serve", help="run the HTTP API (uvicorn); the embedded Redis when no REDIS_URL is set")
    sv.add_argument("--host", default=None, help="listen address (default: SETFLOW_API_HOST, 127.0.0.1)")
    sv.add_argument("--port", type=int, default=None, help="port (default: SETFLOW_API_PORT, 8000)")
    sv.set_defaults(func=cmd_serve)
    sm = sub.add_parser("submit", help="submit a job to the API and follow it with a progress bar: "
                        "submit KIND SPEC.json|- [--session ID]")
    sm.add_argument("kind", choices=["narrative", "agent", "report", "turn", "infill"])
    sm.add_argument("spec", help="the job's spec: a JSON file, '-' for stdin, or inline JSON")
    sm.add_argument("--session", default=None, help="run on this session (default: a new one)")
    sm.add_argument("--priority", default="interactive", choices=["interactive", "batch"])
    sm.add_argument("--url", default=None, help="the API (default: SETFLOW_API_URL or http://127.0.0.1:8000)")
    sm.add_argument("--key", default=None, help="API key (default: SETFLOW_API_KEY)")
    sm.add_argument("--no-wait", action="store_true", help="print the queued job and return")
    sm.set_defaults(func=cmd_submit)
    an = sub.add_parser("answer", help="send the output of a call a waiting job made to a tool its client runs: "
                        "answer JOB CALL_ID OUTPUT")
    an.add_argument("job")
    an.add_argument("call_id", help="the call's id, as the job's required_action names it (call_1, ...)")
    an.add_argument("output", help="a number as the tools write it (2.4, -12.5, 1240), or 'error: <reason>'")
    an.add_argument("--url", default=None, help="the API (default: SETFLOW_API_URL or http://127.0.0.1:8000)")
    an.add_argument("--key", default=None, help="API key (default: SETFLOW_API_KEY)")
    an.set_defaults(func=cmd_answer)
    wk = sub.add_parser("worker", help="start Celery worker processes (one engine each) on this machine")
    wk.add_argument("--name", default=None, help="worker name, its own queue's name (default: host-pid); with "
                    "several processes, NAME-0, NAME-1, ...")
    wk.add_argument("--processes", type=int, default=None,
                    help="worker processes (default: one per GPU, else one per torch_threads cores)")
    wk.add_argument("--loglevel", default="warning", help="Celery log level (default: warning)")
    wk.set_defaults(func=cmd_worker)
    bench = sub.add_parser("bench", help="run a benchmark: bench decode|quality|resume|load|documents|api|batch|state|agent|"
                           "responses|exports|schedules [--quick] ...")
    bench.add_argument("name", choices=["decode", "quality", "resume", "load", "documents", "api", "batch", "state", "agent",
                                        "responses", "exports", "schedules"])
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed on to bench/<name>.py")
    bench.set_defaults(func=cmd_bench)
    tr = sub.add_parser("train", help="train a preset: toy (arithmetic progressions) or small (the shipped "
                        "model, on the narrative/agent/report corpora); resumes from --out")
    tr.add_argument("--preset", default="toy", help="model preset: toy or small (default: toy)")
    tr.add_argument("--steps", type=int, default=None, help="total optimiser steps (default: the preset's recipe)")
    tr.add_argument("--until", type=int, default=None,
                    help="stop after this step's checkpoint, on the schedule of --steps (a stage cut short)")
    tr.add_argument("--out", type=Path, required=True, help="checkpoint folder; resumed when it holds a trainer state")
    tr.add_argument("--seed", type=int, default=0, help="data and initialisation seed (default 0)")
    tr.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the recipe's; a further "
                    "stage of a fine-tune may want less, to keep what the last one learnt)")
    tr.add_argument("--init", type=Path, default=None,
                    help="fine-tune the weights of this checkpoint folder (small: its tokenizer kept; the recipe "
                         "and data of model/corpus/mixture.py FINETUNE: the API's whole grammar)")
    tr.add_argument("--mix", default=None, help="a fine-tune's task shares, e.g. narrative=0.4,agent=0.3,section=0.15,"
                         "infill=0.15 (default: mixture.FINETUNE_MIX)")
    tr.add_argument("--wild", type=float, default=None,
                    help="a fine-tune's share of narratives, sections and agent questions drawn from the API's "
                         "grammar rather than the corpus's lists (default: mixture.WILD)")
    tr.add_argument("--slip", type=float, default=0.0,
                    help="a fine-tune's share of its agent questions over stores of any names whose transcript "
                         "first miscopies a name, reads the tool's error and hint, and mends the call (default 0)")
    tr.add_argument("--drivers", type=float, default=0.0,
                    help="a fine-tune's share of its narratives whose payload asks for the breakdown's drivers "
                         "(a narrative at detail full says them; default 0)")
    tr.set_defaults(func=cmd_train)
    av = sub.add_parser("average", help="the mean of several checkpoints' weights (fine-tune stages of one model: "
                        "the same config and tokenizer), e.g. the shipped model from its last two stages")
    av.add_argument("src", type=Path, nargs="+", help="checkpoint folders (at least two)")
    av.add_argument("--out", type=Path, required=True, help="the checkpoint folder to write (replaced whole)")
    av.set_defaults(func=cmd_average)
    im = sub.add_parser("import", help="convert a released SetDLM checkpoint (HF export, compiled or Composer keys; "
                        "safetensors or tensor-only .bin/.pt) into setflow's format")
    im.add_argument("src", type=Path, help="the checkpoint: a folder (config.json or config.yaml beside it) or a file")
    im.add_argument("--out", type=Path, default=None, help="the setflow checkpoint folder to write")
    im.add_argument("--dry-run", action="store_true", help="list what maps and what does not; write nothing")
    im.add_argument("--config", type=Path, default=None, help="the reference's config.json/config.yaml (default: beside SRC)")
    im.add_argument("--base-config", type=Path, default=None,
                    help="the base model's config.json (default: the public Qwen3 numerics for its name)")
    im.add_argument("--tokenizer", type=Path, default=None, help="tokenizer.json (default: beside SRC)")
    im.add_argument("--name", default=None, help="the model's name (default: the source folder's)")
    im.set_defaults(func=cmd_import)
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
