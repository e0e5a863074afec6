"""Released checkpoints with random weights: Qwen3 backbones written in each layout the reference
(kuleshov-group/setdlms) saves, with its config fields and key names, and a Qwen-style
tokenizer.json (special ids past 151k, BOS = EOS) built with `tokenizers`: no download.  The
tests' tiny checkpoints (tests/model/released.py) and the realistic shapes come from here.

    python bench/checkpoints.py --shape qwen3-0.6b [--layout hf_safetensors] --out DIR
    python bench/checkpoints.py --shape qwen3-0.6b --serve [--dtypes float32,bfloat16]

Shapes: `tiny` (the tests'), `qwen3-0.6b` and `qwen3-1.7b` (the public Qwen3 configs: 28 layers,
16 heads and 8 KV heads of 128, a 151936 vocabulary, tied embeddings).  Weights are drawn
tensor by tensor from one seeded generator and written in shards (HF's `-0000i-of-0000n` files
and their index) of at most --shard-mb, so that memory holds one shard, not the model; a
Composer checkpoint is one pickle (Composer writes one per rank), so it holds the whole model.

--serve: the checkpoint is written to a temporary folder, imported with `setflow import` (a
process of its own), then served by ONE `setflow worker` process per dtype in turn (float32,
then bfloat16, on the CPU), each given one turn job through the API.  Reported per dtype: the
worker's start (heartbeat, then warm: its warm-up turn and its cost model done), its resident
memory, the first job's latency and its decoded tokens/s.  Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml  # type: ignore[import-untyped]
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

if TYPE_CHECKING:  # the serving side's, imported where it runs: the tests' writer needs none of it
    from starlette.testclient import TestClient

    from workers.local import LocalCluster

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ beside its helpers, as a script too

# Qwen3's vocabulary: 151643 BPE tokens, then its special tokens from 151643; the model's
# embedding has 151936 rows.  The reference's [MASK] for Qwen3 is <|fim_middle|>.
QWEN_BPE, QWEN_VOCAB = 151643, 151936
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *[f"<|reserved_{i}|>" for i in range(11)],
                 "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]
ENDOFTEXT, IM_START, IM_END = 151643, 151644, 151645
MASK = QWEN_BPE + QWEN_SPECIALS.index("<|fim_middle|>")  # 151660
BASE = "Qwen/Qwen3-1.7B-Base"
LENGTH, SET_SIZE = 1024, 2
LAYOUTS = ("hf_bin", "hf_safetensors", "compiled", "composer")
#: backbone shapes (Qwen3ForCausalLM's config: hidden_size, num_hidden_layers, num_attention_heads,
#: num_key_value_heads, head_dim, intermediate_size), the base model the reference's config
#: names, and whether that base ties its embeddings (both public configs say true).  `tiny` is
#: every test model: heads of 16 as Qwen3's of 128, in miniature, on Qwen3's vocabulary.
SHAPES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden=32, layers=2, heads=4, kv_heads=2, head_dim=16, ff=64),
    "qwen3-0.6b": dict(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, ff=3072),
    "qwen3-1.7b": dict(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ff=6144),
}
BASES = {"tiny": (BASE, True), "qwen3-0.6b": ("Qwen/Qwen3-0.6B-Base", True), "qwen3-1.7b": (BASE, True)}
STD = 0.3  # sharpened weights (varied confidences) ...
NORM_FROM = 0.5  # ... and norms in [0.5, 1.5): a norm mapped to the wrong place would show
SHARD_MB = 1024  # a shard's bytes at most: what memory holds while writing (a tensor alone may pass it)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@lru_cache(maxsize=1)
def qwen_tokenizer_json() -> str:
    """Byte-level BPE with Qwen's layout: the 256 byte symbols and a few merges first, filler up to
    151643, then the special tokens at Qwen's ids."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    merges = [("t", "h"), ("th", "e"), ("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e"), ("i", "n"), ("e", "r")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    for i in range(len(vocab), QWEN_BPE):
        vocab[f"<unused{i}>"] = i
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(QWEN_SPECIALS)
    assert hf.token_to_id("<|endoftext|>") == ENDOFTEXT and hf.token_to_id("<|fim_middle|>") == MASK
    return hf.to_str()


def qwen3_tensors(shape: str = "tiny", seed: int = 0, tie: bool = True,
                  dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
    """Random weights under Qwen3ForCausalLM's names, one tensor at a time (drawn in fp32 in a
    fixed order, then cast to `dtype`).  Tied: lm_head.weight is embed_tokens.weight, the same
    tensor, given right after it."""
    g = torch.Generator().manual_seed(seed)
    s = SHAPES[shape]
    H, Hkv, D, d, f = s["heads"], s["kv_heads"], s["head_dim"], s["hidden"], s["ff"]

    def w(*dims: int) -> torch.Tensor:
        return (torch.randn(*dims, generator=g) * STD).to(dtype)

    def norm(n: int) -> torch.Tensor:
        return (NORM_FROM + torch.rand(n, generator=g)).to(dtype)

    embed = w(QWEN_VOCAB, d)  # (V, d)
    yield "model.embed_tokens.weight", embed
    if tie:
        yield "lm_head.weight", embed
    del embed  # the caller's reference only: a shard written frees it
    yield "model.norm.weight", norm(d)
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        yield p + "self_attn.q_proj.weight", w(H * D, d)
        yield p + "self_attn.k_proj.weight", w(Hkv * D, d)
        yield p + "self_attn.v_proj.weight", w(Hkv * D, d)
        yield p + "self_attn.o_proj.weight", w(d, H * D)
        yield p + "self_attn.q_norm.weight", norm(D)
        yield p + "self_attn.k_norm.weight", norm(D)
        yield p + "mlp.gate_proj.weight", w(f, d)
        yield p + "mlp.up_proj.weight", w(f, d)
        yield p + "mlp.down_proj.weight", w(d, f)
        yield p + "input_layernorm.weight", norm(d)
        yield p + "post_attention_layernorm.weight", norm(d)
    if not tie:
        yield "lm_head.weight", w(QWEN_VOCAB, d)


def qwen3_state(seed: int = 0, tie: bool = True, shape: str = "tiny") -> dict[str, torch.Tensor]:
    """qwen3_tensors as one state dict, in fp32 (a tiny model's: the tests compare against it)."""
    return dict(qwen3_tensors(shape, seed, tie))


def reference_config(base: str = BASE, length: int = LENGTH) -> dict[str, object]:
    """config.json as the reference's HF export writes it (a BD3LMConfig naming its base model)."""
    return {
        "model_type": "bd3lm", "architectures": ["SetDLM"],
        "auto_map": {"AutoConfig": "denoiser_base.BD3LMConfig", "AutoModelForMaskedLM": "denoiser_setdlm.SetDLM"},
        "length": length, "block_size": length, "eval_block_size": length, "attn_backend": "sdpa",
        "backbone_config": {"_target_": "backbone_automodel.AutoModelFromPreTrained",
                            "automodel_cls": "CustomQwen3ForCausalLM", "pretrained_model_name_or_path": base,
                            "keep_bottom_n_layers": -1, "reinit_model": False},
        "noise_config": {"_target_": "noise_schedule_noise_schedules.StaggeredNoise", "eps": 1e-3,
                         "block_size": length, "desired_block_size": SET_SIZE, "max_block_size": length,
                         "length": length},
        "tokenization_config": {"vocab_size": QWEN_VOCAB, "mask_token_id": MASK, "pad_token_id": ENDOFTEXT,
                                "bos_token_id": ENDOFTEXT, "eos_token_id": ENDOFTEXT, "pad_vocab_size_multiple": 1},
        "tokenizer_name": base, "keep_clean_bos": False, "setdlm_eos_last_in_target_order": False,
        "setdlm_fht_cache_order": False,
    }


def _static_mask(length: int) -> torch.Tensor:
    return torch.ones(2 * length, 2 * length, dtype=torch.bool).tril()  # the reference's 2L x 2L buffer


def _shards(named: Iterable[tuple[str, torch.Tensor]], limit: int) -> Iterator[dict[str, torch.Tensor]]:
    """Consecutive tensors grouped into dicts of at most `limit` bytes (a tensor shared with one
    already in the group, a tied lm_head, counts once)."""
    shard: dict[str, torch.Tensor] = {}
    size, seen = 0, set[int]()
    for name, t in named:
        nbytes = t.numel() * t.element_size() if t.data_ptr() not in seen else 0
        if shard and nbytes and size + nbytes > limit:  # a tied tensor stays with its twin
            yield shard
            shard, size, seen = {}, 0, set()
            nbytes = t.numel() * t.element_size()
        shard[name] = t
        size += nbytes
        seen.add(t.data_ptr())
    if shard:
        yield shard


def _write_sharded(named: Iterable[tuple[str, torch.Tensor]], folder: Path, safetensors: bool, limit: int) -> None:
    """HF's files: one `model.safetensors` (or `pytorch_model.bin`) when everything fits one
    shard, else `model-0000i-of-0000n.safetensors` and `model.safetensors.index.json` naming
    which file holds each tensor."""
    stem, ext = ("model", "safetensors") if safetensors else ("pytorch_model", "bin")
    written: list[tuple[Path, list[str]]] = []
    total = 0
    for shard in _shards(named, limit):
        path = folder / f"{stem}-{len(written) + 1:05d}.part"
        if safetensors:  # it refuses two names on one storage: the tied lm_head is written twice
            seen: set[int] = set()
            out = {}
            for k, v in shard.items():
                out[k] = v.clone() if v.data_ptr() in seen else v.contiguous()
                seen.add(v.data_ptr())
            save_file(out, str(path), metadata={"format": "pt"})
        else:
            torch.save(shard, path)
        total += sum(v.numel() * v.element_size() for v in shard.values())
        written.append((path, list(shard)))
        del shard
    n = len(written)
    if n == 1:
        written[0][0].rename(folder / f"{stem}.{ext}")
        return
    weight_map: dict[str, str] = {}
    for i, (path, names) in enumerate(written, 1):
        final = f"{stem}-{i:05d}-of-{n:05d}.{ext}"
        path.rename(folder / final)
        weight_map |= dict.fromkeys(names, final)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / f"{stem}.{ext}.index.json").write_text(json.dumps(index, indent=2))


def write_release(layout: str, state: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                  folder: Path, *, base: str = BASE, length: int = LENGTH, shard_mb: int = SHARD_MB) -> Path:
    """`state` (Qwen3ForCausalLM names: a dict, or a stream such as qwen3_tensors) saved as the
    reference saves it; returns what to import.  A Composer run holds no tokenizer."""
    named = state.items() if isinstance(state, Mapping) else state
    folder.mkdir(parents=True, exist_ok=True)
    config = reference_config(base, length)
    if layout == "composer":  # a Composer run folder: config.yaml + checkpoints/*.pt, no tokenizer
        sd = {f"model.backbone._orig_mod.model.{k}": v for k, v in named}
        sd["model.static_attention_mask"] = _static_mask(length)
        (folder / "checkpoints").mkdir(exist_ok=True)
        torch.save({"state": {"model": sd, "optimizers": {}, "timestamp": {"epoch": 1, "batch": 100}},
                    "rng": [{"torch": torch.get_rng_state()}]}, folder / "checkpoints" / "best-rank0.pt")
        torch.save({"state": {"model": sd}}, folder / "checkpoints" / "ep0-ba50-rank0.pt")
        (folder / "config.yaml").write_text(yaml.safe_dump({"model": {"_target_": "src.denoiser.diffusion.SetDLM",
                                                                      "config": config},
                                                            "training": {"lr": 3e-4}}))
        return folder
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: one of {', '.join(LAYOUTS)}")
    prefix = "backbone._orig_mod.model." if layout == "compiled" else "backbone.model."
    keyed = chain(((prefix + k, v) for k, v in named), [("static_attention_mask", _static_mask(length))])
    _write_sharded(keyed, folder, layout == "hf_safetensors", shard_mb << 20)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(qwen_tokenizer_json())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "bos_token": None,
                                                              "pad_token": "<|endoftext|>"}))
    return folder


def tokenizer_file(folder: Path) -> Path:
    """The tokenizer where a Composer run has none: `folder`/qwen-tokenizer.json (--tokenizer)."""
    path = folder / "qwen-tokenizer.json"
    path.write_text(qwen_tokenizer_json())
    return path


# -- the script: write one, or write, import and serve it ------------------------------------------

def write(shape: str, layout: str, out: Path, *, seed: int = 0, dtype: str = "bfloat16", length: int = LENGTH,
          shard_mb: int = SHARD_MB) -> dict[str, Any]:
    """A released checkpoint of `shape` in `out`, and what `setflow import` needs to read it (a
    Composer run: its tokenizer beside, for --tokenizer).  Its bytes and the seconds it took."""
    base, tie = BASES[shape]
    t = time.perf_counter()
    src = write_release(layout, qwen3_tensors(shape, seed, tie, DTYPES[dtype]), out, base=base, length=length,
                        shard_mb=shard_mb)
    tok = tokenizer_file(out) if layout == "composer" else None
    write_s = time.perf_counter() - t
    files = sorted(p for p in out.rglob("*") if p.is_file())
    return {"shape": shape, "layout": layout, "weights_dtype": dtype, "seed": seed, "src": str(src),
            "tokenizer": str(tok) if tok else None, "files": len(files),
            "bytes": sum(p.stat().st_size for p in files), "write_s": round(write_s, 2)}


def import_cmd(written: dict[str, Any], dst: Path, *, dry_run: bool = False) -> list[str]:
    """`setflow import` of a written checkpoint, as a command line."""
    cmd = [sys.executable, "-m", "app.cli", "import", written["src"]]
    cmd += ["--dry-run"] if dry_run else ["--out", str(dst), "--name", f"{written['shape']}-random"]
    return cmd + (["--tokenizer", written["tokenizer"]] if written["tokenizer"] else [])


def run_import(written: dict[str, Any], dst: Path) -> dict[str, Any]:
    """The real `setflow import`, a process of its own: its seconds and its peak resident memory
    (getrusage of the children waited for: this is the first)."""
    t = time.perf_counter()
    done = subprocess.run(import_cmd(written, dst), cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True)
    import_s = time.perf_counter() - t
    if done.returncode != 0:
        raise RuntimeError(f"setflow import failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    print(done.stdout.strip(), flush=True)
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    out_bytes = sum(p.stat().st_size for p in dst.iterdir() if p.is_file())
    return {"import_s": round(import_s, 2), "import_peak_rss_mb": round(peak_mb, 1), "imported_bytes": out_bytes,
            "model": json.loads((dst / "config.json").read_text())["name"]}


def serve(model_dir: Path, model: str, dtypes: list[str], data_dir: Path, *, threads: int, batch: int | None,
          new_tokens: int) -> list[dict[str, Any]]:
    """One worker process per dtype in turn (the last killed before the next starts: they would
    not both fit), each given one turn job through the API: its figures."""
    from starlette.testclient import TestClient

    from bench.machine import find_redis
    from runtime.api.app import create_app
    from workers.celery_app import sender
    from workers.local import LocalCluster

    key = f"key-ckpt-{uuid.uuid4().hex[:8]}"
    url, server = find_redis(data_dir)
    fields: dict[str, Any] = {"torch_threads": threads, **({"batch_sessions": batch} if batch else {})}
    c = LocalCluster(data_dir / "cluster", redis_url=url, key_prefix=f"sfck-{uuid.uuid4().hex[:8]}",
                     api_keys={key: "bench"}, tenant_burst=1000, tenant_rate_per_s=1000.0, **fields)
    rows = []
    try:
        app = create_app(c.settings, client=c.client, send=sender(c.app))
        with TestClient(app) as http:
            for dtype in dtypes:
                name = f"ck-{dtype}"
                row = {"dtype": dtype, **start_worker(c, name, model_dir, dtype)}
                row |= first_job(c, name, http, key, {"kind": "turn", "model": model, "numerics": f"cpu/{dtype}",
                                                      "spec": {"text": "the theory of the revenue in the north",
                                                               "params": {"policy": "ar", "max_new_tokens": new_tokens}}})
                c.kill(name)
                print(f"  {dtype}: alive {row['worker_alive_s']} s, ready {row['worker_ready_s']} s, "
                      f"RSS {row['rss_ready_mb']} MB (peak {row['peak_rss_mb']} MB); first job {row['first_job_ms']} ms, "
                      f"{row['tokens']} tokens in {row['decode_ms']} ms ({row['tokens_per_s']} tokens/s)", flush=True)
                rows.append(row)
    finally:
        c.close()
        if server is not None:
            server.stop()
    return rows


def start_worker(c: LocalCluster, name: str, model_dir: Path, dtype: str) -> dict[str, Any]:
    """`setflow worker` on `model_dir` in `dtype`: seconds to its first heartbeat (Celery up, the
    model not loaded yet) and to ready (the model loaded, the cost model measured, a 2-token
    warm-up turn run: LocalCluster.ready), and its resident memory then (MB)."""
    from bench.machine import group_rss_mb

    t = time.perf_counter()
    c.start(name, model_dir=str(model_dir), dtype=dtype)
    while not c.dispatcher.routing.alive(name):
        if c.procs[name].poll() is not None:
            raise RuntimeError(f"worker {name} exited:\n{c.log(name)}")
        time.sleep(0.1)
    alive_s = time.perf_counter() - t
    c.ready(name, timeout_s=1800)
    return {"worker_alive_s": round(alive_s, 1), "worker_ready_s": round(time.perf_counter() - t, 1),
            "rss_ready_mb": group_rss_mb(c.procs[name].pid), "peak_rss_mb": peak_rss_mb(c.procs[name].pid)}


def peak_rss_mb(pgid: int) -> float:
    """The largest peak resident memory (VmHWM) of a process group's processes: a worker's model
    loads in its pool process, so this is what starting it took at most."""
    peak = 0
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                hwm = [ln for ln in (d / "status").read_text().splitlines() if ln.startswith("VmHWM:")]
                peak = max(peak, int(hwm[0].split()[1]) if hwm else 0)
        except (OSError, ValueError, IndexError):
            continue
    return round(peak / 1024, 1)


def first_job(c: LocalCluster, name: str, http: TestClient, key: str, body: dict[str, Any]) -> dict[str, Any]:
    """One job through the API (POST /v1/jobs) on worker `name`: ms from the POST to its end,
    its decode time and tokens/s as the turn reports them, the worker's memory after."""
    from bench.machine import group_rss_mb

    t = time.perf_counter()
    r = http.post("/v1/jobs", headers={"Authorization": f"Bearer {key}"}, json=body)
    if r.status_code != 202:
        raise RuntimeError(f"job refused: {r.status_code} {r.text}")
    done = c.wait(r.json()["id"], 1800)
    job_ms = 1000 * (time.perf_counter() - t)
    if done.status != "succeeded" or done.result is None:
        raise RuntimeError(f"job {done.id} {done.status}: {done.error}\n{c.log(name)}")
    res, costs = done.result, done.result["costs"]  # workflows/turn.py run(): the turn's costs in s
    decode_ms = round(1000 * costs.get("decode_s", 0.0), 1)
    return {"first_job_ms": round(job_ms, 1), "ran_on": res.get("worker"), "tokens": len(res["tokens"]),
            "nfe": res["nfe"], "load_ms": round(1000 * costs.get("load_s", 0.0), 1), "decode_ms": decode_ms,
            "tokens_per_s": round(1000 * len(res["tokens"]) / decode_ms, 2) if decode_ms else None,
            "rss_after_job_mb": group_rss_mb(c.procs[name].pid)}


def parse(argv: list[str] | None, prog: str | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="qwen3-0.6b")
    ap.add_argument("--layout", choices=LAYOUTS, default="hf_safetensors")
    ap.add_argument("--out", type=Path, help="the folder to write (not with --serve: a temporary one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=list(DTYPES), default="bfloat16", help="the weights' (released: bfloat16)")
    ap.add_argument("--length", type=int, default=LENGTH, help=f"the trained length in the config (default {LENGTH})")
    ap.add_argument("--shard-mb", type=int, default=SHARD_MB, help=f"a shard's MiB at most (default {SHARD_MB})")
    ap.add_argument("--serve", action="store_true", help="import it with `setflow import`, serve it, run one job")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="--serve: the workers' dtypes, in turn")
    ap.add_argument("--threads", type=int, default=1, help="--serve: torch threads of the worker (default 1)")
    ap.add_argument("--batch", type=int, default=None, help="--serve: the worker's batch_sessions (default: its own)")
    ap.add_argument("--new-tokens", type=int, default=16, help="--serve: the job's tokens (greedy AR; default 16)")
    args = ap.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if any(d not in DTYPES for d in args.dtypes) or not args.dtypes:
        ap.error(f"--dtypes: a comma-separated list of {', '.join(DTYPES)}")
    if min(args.length, args.shard_mb, args.threads, args.new_tokens) < 1 or (args.batch is not None and args.batch < 1):
        ap.error("--length, --shard-mb, --threads, --batch and --new-tokens must be >= 1")
    if args.serve == (args.out is not None):
        ap.error("give --out DIR (write a checkpoint) or --serve (write, import and serve one), not both")
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        ap.error(f"--out {args.out}: not empty")
    return args


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    args = parse(argv, prog)
    torch.set_num_threads(1)  # the writer draws and casts: one core is what it gets on a shared machine
    if not args.serve:
        written = write(args.shape, args.layout, args.out, seed=args.seed, dtype=args.dtype, length=args.length,
                        shard_mb=args.shard_mb)
        print(f"wrote {args.shape} ({args.layout}, {args.dtype}) to {args.out}: {written['bytes'] / 2**20:.1f} MiB "
              f"in {written['files']} files, {written['write_s']} s; import it with:\n  "
              + " ".join(["setflow", *import_cmd(written, Path("OUT"))[3:]]), flush=True)
        result = {"bench": "checkpoints", **written}
        print(json.dumps(result))
        return result
    with tempfile.TemporaryDirectory(prefix="sfck") as tmp:
        written = write(args.shape, args.layout, Path(tmp) / "src", seed=args.seed, dtype=args.dtype,
                        length=args.length, shard_mb=args.shard_mb)
        print(f"wrote {args.shape} ({args.layout}): {written['bytes'] / 2**20:.1f} MiB in {written['write_s']} s",
              flush=True)
        imported = run_import(written, Path(tmp) / "imported")
        shutil.rmtree(Path(tmp) / "src")  # the worker reads the import: the source's disk is given back
        rows = serve(Path(tmp) / "imported", imported["model"], args.dtypes, Path(tmp), threads=args.threads,
                     batch=args.batch, new_tokens=args.new_tokens)
    result = {"bench": "checkpoints", **written, **imported, "threads": args.threads, "batch": args.batch,
              "new_tokens": args.new_tokens, "rows": rows}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
