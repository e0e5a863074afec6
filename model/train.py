"""The set-diffusion training objective and a small training loop.

Objective (reference note, 1.2-1.5): sample a staggered generation order per sequence; lay out
[clean tokens in that order | [MASK] copies of the targets] with RoPE on the ORIGINAL positions;
attend with the static set-causal mask; cross-entropy on every target token (prompt and padding
excluded), per-sequence mean, then batch mean.  Knows nothing about corpora beyond
(token ids, prompt length) examples.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from model import checkpoint
from model.config import ModelConfig
from model.masks import training_mask
from model.order import sample_orders
from model.transformer import SetDLM

# Token roles.  CONTEXT: clean, first in the order (a prompt; an infill template's text on both
# sides of its holes).  TARGET: generated, with a loss.  GIVEN: in the generation order where it
# stands but without a loss: text the runtime appends mid-sequence (tool results).
CONTEXT, TARGET, GIVEN = 0, 1, 2
# (token ids, prompt length: targets are ids[prompt_len:]) or (token ids, a role per token)
Example = tuple[list[int], int | list[int]]


@dataclass
class Batch:
    ids: Tensor  # (B, L) long, padded with pad_id
    target: Tensor  # (B, L) bool: generated tokens (TARGET or GIVEN): ordered by the sampler
    valid: Tensor  # (B, L) bool: not padding
    loss: Tensor | None = None  # (B, L) bool: the tokens that get a loss; None = all targets


def roles_of(example: Example) -> list[int]:
    toks, spec = example
    if isinstance(spec, int):
        return [CONTEXT] * spec + [TARGET] * (len(toks) - spec)
    if len(spec) != len(toks):
        raise ValueError(f"{len(spec)} roles for {len(toks)} tokens")
    return list(spec)


def collate(examples: Sequence[Example], L: int, pad_id: int) -> Batch:
    B = len(examples)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    role = torch.full((B, L), -1, dtype=torch.long)  # -1: padding
    for b, ex in enumerate(examples):
        toks = ex[0]
        assert len(toks) <= L, f"example of {len(toks)} tokens > sequence length {L}"
        ids[b, : len(toks)] = torch.tensor(toks)
        role[b, : len(toks)] = torch.tensor(roles_of(ex), dtype=torch.long)
    target = (role == TARGET) | (role == GIVEN)
    loss = None if not bool((role == GIVEN).any()) else role == TARGET
    return Batch(ids, target, role >= 0, loss)


def forward_logits(model: SetDLM, batch: Batch, perm: Tensor) -> Tensor:
    """The two-stream forward for given orders.  perm: (B, L), perm[b, r] = position at rank r.
    Returns the noisy-stream logits in RANK order: (B, L, vocab)."""
    cfg = model.cfg
    B, L = batch.ids.shape
    clean = batch.ids.gather(1, perm)  # (B, L) tokens in generation order
    tgt = batch.target.gather(1, perm)  # (B, L)
    noisy = torch.where(tgt, cfg.mask_id, clean)  # [MASK] for targets; others copied (unused)
    ids = torch.cat([clean, noisy], dim=1)  # (B, 2L)
    pos = torch.cat([perm, perm], dim=1)  # (B, 2L): RoPE on the original positions
    mask = training_mask(L, batch.valid.gather(1, perm))  # (B, 2L, 2L)
    logits, _ = model(ids, pos, mask)
    return logits[:, L:]  # (B, L, vocab)


def loss_for_orders(model: SetDLM, batch: Batch, perm: Tensor) -> Tensor:
    """The objective for given orders: forward_logits' loss, computed without the [MASK] copies
    of the ranks that hold context in every row.  Exact: a clean query never sees the noisy
    stream and a noisy query sees only clean keys and itself, so those copies change nothing
    but cost compute (a prompt is often half of a row, an infill template's context most of it)."""
    cfg = model.cfg
    B, L = batch.ids.shape
    clean = batch.ids.gather(1, perm)  # (B, L) tokens in generation order
    tgt = batch.target.gather(1, perm)  # (B, L)
    first = torch.where(tgt.any(1), tgt.float().argmax(1), torch.full((B,), L, device=tgt.device))
    skip = min(int(first.min()), L - 1)  # ranks < skip are context (or padding) in every row
    noisy = torch.where(tgt, cfg.mask_id, clean)[:, skip:]  # (B, L - skip)
    ids = torch.cat([clean, noisy], dim=1)  # (B, 2L - skip)
    pos = torch.cat([perm, perm[:, skip:]], dim=1)  # RoPE on the original positions
    keep = torch.cat([torch.arange(L), torch.arange(L + skip, 2 * L)]).to(clean.device)
    mask = training_mask(L, batch.valid.gather(1, perm))[:, keep][:, :, keep]  # (B, 2L - skip, 2L - skip)
    logits, _ = model(ids, pos, mask)
    logits = logits[:, L:].float()  # (B, L - skip, vocab) for ranks skip..L-1
    logits[..., cfg.mask_id] = -torch.inf  # [MASK] is never a target
    weight = (batch.target if batch.loss is None else batch.loss).gather(1, perm)[:, skip:].float()
    ce = F.cross_entropy(logits.transpose(1, 2), clean[:, skip:], reduction="none")  # (B, L - skip)
    per_seq = (ce * weight).sum(1) / weight.sum(1).clamp(min=1)
    return per_seq.mean()


def training_loss(model: SetDLM, batch: Batch, generator: torch.Generator | None = None) -> Tensor:
    cfg = model.cfg
    perm = sample_orders(batch.target, cfg.set_size, cfg.max_set_size, generator, valid=batch.valid)
    return loss_for_orders(model, batch, perm)


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32
    seq_len: int = 64
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.0
    seed: int = 0
    log_every: int = 10
    ckpt_every: int = 200


def fresh_rows(model: SetDLM, ids: list[int]) -> None:
    """Draw the embedding rows of `ids` anew (tied: the output's too), at the trained rows' scale.
    Training pushes every unused row one way (in the shipped model their cosines were 0.999), so
    tokens added there would be one token to the model: each must be told apart to be copied."""
    w = model.embed_tokens.weight  # (vocab, d_model)
    keep = torch.ones(w.shape[0], dtype=torch.bool)
    keep[ids] = False
    with torch.no_grad():
        w[ids] = torch.randn(len(ids), w.shape[1]) * w[keep].std()


def train(cfg: ModelConfig, batches: Callable[[int], Iterator[list[Example]]], tc: TrainConfig,
          out: str | Path | None = None, tokenizer_json: str | None = None, resume: bool = True,
          progress: bool = True, init: str | Path | None = None,
          data: dict[str, Any] | None = None, fresh_ids: list[int] | None = None,
          until: int | None = None) -> tuple[SetDLM, list[float]]:
    """AdamW with linear warm-up then cosine decay to 10%.  batches(start_step) yields lists of
    examples from that step on (so a resumed run sees the same data).  Checkpoints to `out`
    every ckpt_every steps; resumes from `out` when it holds a trainer state.  init: a
    checkpoint folder whose weights a fresh run starts from (a fine-tune; its shapes must be
    cfg's, its context may differ).  data: what makes the run's data stream (its seed, mix,
    share of wild payloads: JSON), kept with the trainer state; a resume with other data is
    refused (it would go on with another stream under the same schedule).  fresh_ids: tokens
    the init's vocabulary lacked (the fact slots added to it): their rows drawn anew.  until: stop
    after this step's checkpoint, on the schedule of tc.steps (a stage cut short, reproducibly)."""
    torch.manual_seed(tc.seed)
    model = SetDLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(tc.seed + 1)
    start, losses = 0, []
    folder = Path(out) if out is not None else None
    if folder is not None:
        checkpoint.recover(folder)
    if folder is not None and resume and (folder / "trainer.json").exists():
        saved = checkpoint.load_config(folder)
        if saved != cfg:
            raise ValueError(f"{folder} holds a checkpoint of another model config ({saved.name}); "
                             f"cannot resume it as {cfg.name!r}")
        checkpoint.load_weights(model, folder)
        meta = checkpoint.load_optimizer(opt, folder)
        if data is not None and meta.get("data", data) != data:  # a state saved before "data": taken
            raise ValueError(f"{folder} holds a run on other data ({json.dumps(meta['data'], sort_keys=True)}); "
                             f"resume it with the same settings, not {json.dumps(data, sort_keys=True)}")
        start, losses = int(meta["step"]), list(meta["losses"])
        gen.set_state(torch.tensor(meta["rng"], dtype=torch.uint8))
    elif init is not None:
        base = checkpoint.load_config(init)
        if replace(base, max_seq_len=cfg.max_seq_len, name=cfg.name) != cfg:
            raise ValueError(f"{init} holds weights of another shape ({base.name}); cannot fine-tune them as {cfg.name!r}")
        checkpoint.load_weights(model, init)
        if fresh_ids:
            fresh_rows(model, fresh_ids)

    def lr_at(s: int) -> float:
        if s < tc.warmup:
            return tc.lr * (s + 1) / tc.warmup
        frac = (s - tc.warmup) / max(1, tc.steps - tc.warmup)
        return tc.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    def save(step: int) -> None:
        if folder is None:
            return
        with checkpoint.atomic_folder(folder) as tmp:  # weights, optimizer and step move together
            checkpoint.save(model, tmp, tokenizer_json)
            checkpoint.save_optimizer(opt, tmp, {"step": step, "losses": losses, "rng": gen.get_state().tolist(),
                                                 "saved_at": time.time(), **({"data": data} if data else {})})

    model.train()
    it = batches(start)
    end = tc.steps if until is None else min(until, tc.steps)
    bar = tqdm(range(start, end), initial=start, total=tc.steps, disable=not progress,
               desc="train", dynamic_ncols=True)
    for s in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        examples = next(it)
        # pad to the longest example (rounded up to 32), not to seq_len: attention is quadratic
        L = min(tc.seq_len, -(-max(len(e[0]) for e in examples) // 32) * 32)
        batch = collate(examples, L, cfg.pad_id)
        loss = training_loss(model, batch, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (s + 1) % tc.log_every == 0:
            bar.set_postfix(loss=f"{sum(losses[-tc.log_every:]) / tc.log_every:.4f}", lr=f"{lr_at(s):.2e}")
        if (s + 1) % tc.ckpt_every == 0 or s + 1 in (tc.steps, end):
            save(s + 1)
    model.eval()
    return model, losses
