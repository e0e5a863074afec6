"""I7 (training forward == incremental decoding), I16 (loss sanity), and the training loop."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from model.config import ModelConfig
from model.decode import prefill
from model.kv_cache import KVCache
from model.masks import position_mask, step_mask
from model.order import ranks, sample_orders
from model.train import Batch, Example, TrainConfig, collate, forward_logits, loss_for_orders, train, training_loss
from model.transformer import SetDLM

EXAMPLES: list[Example] = [([2, 10, 11, 12, 13, 14, 15, 16, 17, 3], 3),
                           ([2, 20, 22, 24, 26, 28, 3], 2),
                           ([2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 3], 4)]


def _batch(L: int = 14) -> Batch:
    return collate(EXAMPLES, L, pad_id=0)


@torch.no_grad()
def test_I7_training_logits_equal_incremental_evaluation(model: SetDLM) -> None:
    batch = _batch()
    perm = sample_orders(batch.target, d=4, generator=torch.Generator().manual_seed(0))
    logits = forward_logits(model, batch, perm)  # (B, L, V) noisy stream, rank order
    for b in range(len(EXAMPLES)):
        order = perm[b].tolist()
        clean = batch.ids[b].tolist()
        for r in range(len(EXAMPLES[b][0])):
            if not batch.target[b, order[r]]:
                continue
            cache = KVCache.for_model(model.cfg)
            prefill(model, cache, [clean[p] for p in order[:r]], order[:r])  # ranks < r, in order
            one, _ = model(torch.tensor([model.cfg.mask_id]), torch.tensor([order[r]]), step_mask(r, 0, 1), cache)
            torch.testing.assert_close(logits[b, r], one[0, 0], atol=1e-5, rtol=0)


@torch.no_grad()
def test_I16_d1_loss_is_deterministic_and_ar_like(model: SetDLM) -> None:
    cfg = ModelConfig.from_name("test", set_size=1)
    m = SetDLM(cfg)
    m.load_state_dict(model.state_dict())
    batch = _batch()
    a = training_loss(m, batch, torch.Generator().manual_seed(1))
    b = training_loss(m, batch, torch.Generator().manual_seed(2))
    assert torch.equal(a, b)
    identity = torch.arange(batch.ids.shape[1]).expand_as(batch.ids)
    torch.testing.assert_close(a, loss_for_orders(m, batch, identity))


@torch.no_grad()
def test_I16_padding_and_prompt_are_excluded_from_the_loss(model: SetDLM) -> None:
    batch = _batch()
    perm = sample_orders(batch.target, d=4, generator=torch.Generator().manual_seed(3))
    base = loss_for_orders(model, batch, perm)
    noisy_pad = Batch(batch.ids.clone(), batch.target, batch.valid)
    noisy_pad.ids[~batch.valid] = torch.randint(4, 60, (int((~batch.valid).sum()),))
    torch.testing.assert_close(loss_for_orders(model, noisy_pad, perm), base, atol=1e-6, rtol=0)
    # the loss is exactly the mean CE over target tokens: prompt and padding terms carry no weight
    logits = forward_logits(model, batch, perm)
    logits[..., model.cfg.mask_id] = -torch.inf
    clean = batch.ids.gather(1, perm)
    tgt = batch.target.gather(1, perm)
    per_seq = [F.cross_entropy(logits[b][tgt[b]], clean[b][tgt[b]]) for b in range(len(EXAMPLES))]
    torch.testing.assert_close(base, torch.stack(per_seq).mean(), atol=1e-6, rtol=0)


@torch.no_grad()
def test_I16_permuted_layout_equals_position_space_mask(model: SetDLM) -> None:
    batch = _batch()
    L = batch.ids.shape[1]
    perm = sample_orders(batch.target, d=4, generator=torch.Generator().manual_seed(4))
    permuted = loss_for_orders(model, batch, perm)
    # position space: no permutation, the rank-based mask instead
    noisy = torch.where(batch.target, model.cfg.mask_id, batch.ids)
    pos = torch.arange(L).expand_as(batch.ids)
    logits, _ = model(torch.cat([batch.ids, noisy], 1), torch.cat([pos, pos], 1),
                      position_mask(ranks(perm), batch.valid))
    logits = logits[:, L:].float()
    logits[..., model.cfg.mask_id] = -torch.inf
    ce = F.cross_entropy(logits.transpose(1, 2), batch.ids, reduction="none")
    t = batch.target.float()
    direct = ((ce * t).sum(1) / t.sum(1)).mean()
    torch.testing.assert_close(permuted, direct, atol=1e-5, rtol=0)


def _corpus(start: int) -> Iterator[list[Example]]:
    """Counting sequences; the batch of step s depends only on s (resumable)."""
    s = start
    while True:
        g = torch.Generator().manual_seed(s)
        batch = []
        for _ in range(8):
            a = int(torch.randint(4, 30, (1,), generator=g))
            batch.append(([2, a, a + 1] + list(range(a + 2, a + 14)) + [3], 3))
        yield batch
        s += 1


def test_training_learns_and_resumes_exactly(tmp_path: Path) -> None:
    cfg = ModelConfig.from_name("test", set_size=2)
    tc = TrainConfig(steps=30, batch_size=8, seq_len=20, lr=3e-3, warmup=5, ckpt_every=10, log_every=5)
    straight, losses = train(cfg, _corpus, tc, out=tmp_path / "a", progress=False)
    assert losses[-1] < losses[0] * 0.8, "the loss goes down"
    assert (tmp_path / "a" / "model.safetensors").exists() and (tmp_path / "a" / "config.json").exists()

    def crashing(start: int) -> Iterator[list[Example]]:  # dies before step 20's batch
        for s, b in enumerate(_corpus(start), start):
            if s == 20:
                raise KeyboardInterrupt
            yield b

    with pytest.raises(KeyboardInterrupt):
        train(cfg, crashing, tc, out=tmp_path / "b", progress=False)
    resumed, losses_b = train(cfg, _corpus, tc, out=tmp_path / "b", progress=False)
    assert len(losses_b) == 30 and losses_b == pytest.approx(losses, abs=1e-6)
    for (n, p), (_, q) in zip(straight.named_parameters(), resumed.named_parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=n)


def test_a_stage_cut_short_keeps_its_schedule_and_resumes_to_the_same_run(tmp_path: Path) -> None:
    """--until: stop after that step's checkpoint, the learning rate on the schedule of all steps;
    run again without it, the stage ends as one run straight through would."""
    cfg = ModelConfig.from_name("test", set_size=2)
    tc = TrainConfig(steps=30, batch_size=8, seq_len=20, lr=3e-3, warmup=5, ckpt_every=10, log_every=5)
    _, straight = train(cfg, _corpus, tc, out=tmp_path / "a", progress=False)
    _, cut = train(cfg, _corpus, tc, out=tmp_path / "b", progress=False, until=15)
    assert len(cut) == 15 and cut == pytest.approx(straight[:15], abs=1e-6)
    _, resumed = train(cfg, _corpus, tc, out=tmp_path / "b", progress=False)
    assert resumed == pytest.approx(straight, abs=1e-6)


def test_tokens_new_to_an_init_get_rows_of_their_own(tmp_path: Path) -> None:
    """fresh_ids: rows drawn anew at the trained rows' scale, each its own direction (the unused
    rows a trained model leaves are one direction: added tokens there could not be told apart)."""
    cfg = ModelConfig.from_name("test", set_size=2)
    tc = TrainConfig(steps=2, batch_size=8, seq_len=20, warmup=1, ckpt_every=1)
    model, _ = train(cfg, _corpus, tc, out=tmp_path / "base", progress=False)
    with torch.no_grad():
        model.embed_tokens.weight[40:50] = model.embed_tokens.weight[40]  # collapsed, as unused rows are
    from model import checkpoint
    checkpoint.save(model, tmp_path / "init")
    tuned, _ = train(cfg, _corpus, TrainConfig(steps=1, batch_size=8, seq_len=20, warmup=1, lr=1e-9),
                     init=tmp_path / "init", progress=False, fresh_ids=list(range(40, 50)))
    w = torch.nn.functional.normalize(tuned.embed_tokens.weight[40:50], dim=1)
    assert (w @ w.T - torch.eye(10)).abs().max() < 0.9


def test_resume_refuses_another_config(tmp_path: Path) -> None:
    tc = TrainConfig(steps=2, batch_size=8, seq_len=20, warmup=1, ckpt_every=1)
    train(ModelConfig.from_name("test", set_size=2), _corpus, tc, out=tmp_path, progress=False)
    other = ModelConfig.from_name("test", set_size=4)  # same tensor shapes, another objective
    with pytest.raises(ValueError, match="another model config"):
        train(other, _corpus, TrainConfig(steps=3, batch_size=8, seq_len=20), out=tmp_path, progress=False)


def test_roles_given_tokens_are_ordered_but_get_no_loss(model: SetDLM) -> None:
    from model.train import CONTEXT, GIVEN, TARGET, roles_of
    ids = [2, 10, 11, 12, 13, 14, 15, 3]
    roles = [CONTEXT, CONTEXT, TARGET, GIVEN, GIVEN, TARGET, TARGET, TARGET]
    assert roles_of((ids, 2)) == [CONTEXT] * 2 + [TARGET] * 6
    with pytest.raises(ValueError, match="roles"):
        roles_of((ids, roles[:-1]))
    b = collate([(ids, roles)], 8, pad_id=0)
    assert b.target.tolist()[0] == [r != CONTEXT for r in roles]
    assert b.loss is not None and b.loss.tolist()[0] == [r == TARGET for r in roles]
    assert collate([(ids, 2)], 8, pad_id=0).loss is None, "no GIVEN: every target has a loss"
    # the loss is the mean cross-entropy over the TARGET tokens only
    perm = sample_orders(b.target, d=2, generator=torch.Generator().manual_seed(0), valid=b.valid)
    with torch.no_grad():
        logits = forward_logits(model, b, perm).float()
        logits[..., model.cfg.mask_id] = -torch.inf
        clean = b.ids.gather(1, perm)
        ce = F.cross_entropy(logits[0], clean[0], reduction="none")
        keep = b.loss.gather(1, perm)[0]
        assert torch.allclose(loss_for_orders(model, b, perm), ce[keep].mean())


def test_loss_skips_context_mask_copies_exactly(model: SetDLM) -> None:
    """loss_for_orders leaves out the [MASK] copies of ranks that are context in every row; the
    loss equals the one over forward_logits' full two-stream layout."""
    batch = _batch()
    perm = sample_orders(batch.target, d=2, generator=torch.Generator().manual_seed(5), valid=batch.valid)
    with torch.no_grad():
        logits = forward_logits(model, batch, perm).float()
        logits[..., model.cfg.mask_id] = -torch.inf
        clean = batch.ids.gather(1, perm)
        tgt = batch.target.gather(1, perm).float()
        ce = F.cross_entropy(logits.transpose(1, 2), clean, reduction="none")
        full = ((ce * tgt).sum(1) / tgt.sum(1)).mean()
        assert torch.allclose(loss_for_orders(model, batch, perm), full, atol=1e-6)
