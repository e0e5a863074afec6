"""Checkpoints: safetensors round trip, fingerprints, prefix stripping of imported weights."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from model import checkpoint, rowdot
from model.masks import step_mask
from model.transformer import SetDLM
from tests.fakes import random_model


@torch.no_grad()
def test_save_load_round_trip(model: SetDLM, tmp_path: Path) -> None:
    checkpoint.save(model, tmp_path, tokenizer_json='{"fake": true}')
    assert {p.name for p in tmp_path.iterdir()} == {"model.safetensors", "config.json", "tokenizer.json"}
    loaded = checkpoint.load(tmp_path)
    ids, pos = torch.tensor([2, 5, 9, 1]), torch.arange(4)
    a, _ = model(ids, pos, step_mask(0, 3, 1))
    b, _ = loaded(ids, pos, step_mask(0, 3, 1))
    assert torch.equal(a, b)
    assert checkpoint.fingerprint(loaded) == checkpoint.fingerprint(model)


def test_fingerprint_tracks_the_weights() -> None:
    a, b = random_model(0), random_model(0)
    assert checkpoint.fingerprint(a) == checkpoint.fingerprint(b)
    with torch.no_grad():
        b.norm.weight[0] += 1e-3
    b.__dict__.pop("_fingerprint")
    assert checkpoint.fingerprint(a) != checkpoint.fingerprint(b)


def test_fingerprint_tracks_the_cpu_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """K/V computed by other kernels have other bits: a worker whose kernels differ (another
    source, another CPU's kinds, none) is another model to a session."""
    before = checkpoint.fingerprint(random_model(0))
    monkeypatch.setattr(rowdot, "name", lambda: "rowdot-00000000-00")
    assert checkpoint.fingerprint(random_model(0)) != before


def test_import_strips_qwen3_setdlm_prefixes(model: SetDLM, tmp_path: Path) -> None:
    checkpoint.save(model, tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    hf_style = {f"backbone.model.model.{k}": v for k, v in state.items()}
    hf_style["backbone.model.lm_head.weight"] = state["embed_tokens.weight"]
    fresh = random_model(seed=5)
    checkpoint.load_state(fresh, hf_style)
    assert checkpoint.fingerprint(fresh) == checkpoint.fingerprint(model)


def test_a_checkpoint_of_another_shape_is_refused(model: SetDLM) -> None:
    state = {k: v for k, v in model.state_dict().items() if k != "norm.weight"}
    with pytest.raises(ValueError, match="missing"):
        checkpoint.load_state(random_model(1), state)


def test_atomic_folder_is_all_or_nothing(model: SetDLM, tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    with checkpoint.atomic_folder(target) as tmp:
        checkpoint.save(model, tmp)
    first = (target / "model.safetensors").read_bytes()
    with pytest.raises(RuntimeError):
        with checkpoint.atomic_folder(target) as tmp:
            (tmp / "model.safetensors").write_bytes(b"half")
            raise RuntimeError("crash mid-save")
    assert (target / "model.safetensors").read_bytes() == first, "the previous save survives"
    target.rename(tmp_path / "ckpt.old")  # a crash between the two renames
    checkpoint.recover(target)
    assert checkpoint.load(target) is not None


def test_the_context_length_is_not_part_of_the_fingerprint() -> None:
    """A longer context keeps the caches and sessions of the shorter (the same K/V at any length);
    any other part of the config does not."""
    a = random_model(seed=0)
    longer = SetDLM(replace(a.cfg, max_seq_len=2 * a.cfg.max_seq_len))
    longer.load_state_dict(a.state_dict())
    assert checkpoint.fingerprint(longer) == checkpoint.fingerprint(a)
    other = SetDLM(replace(a.cfg, rope_theta=2 * a.cfg.rope_theta))
    other.load_state_dict(a.state_dict())
    assert checkpoint.fingerprint(other) != checkpoint.fingerprint(a)


def test_average_is_the_mean_of_the_weights_and_refuses_other_models(tmp_path: Path) -> None:
    a, b, c = (tmp_path / n for n in "abc")
    checkpoint.save(random_model(0), a, tokenizer_json='{"t": 1}')
    checkpoint.save(random_model(1), b, tokenizer_json='{"t": 1}')
    checkpoint.save(random_model(2), c, tokenizer_json='{"t": 1}')
    checkpoint.average([a, b, c], tmp_path / "mean")
    wa, wb, wc, mean = (load_file(str(f / "model.safetensors")) for f in (a, b, c, tmp_path / "mean"))
    assert mean.keys() == wa.keys()
    for k in wa:
        want = ((wa[k].double() + wb[k].double() + wc[k].double()) / 3).float()
        assert torch.equal(mean[k], want), k
    assert (tmp_path / "mean" / "tokenizer.json").read_text() == '{"t": 1}'
    checkpoint.average([a, a], tmp_path / "same")  # a model's mean with itself is itself
    same = load_file(str(tmp_path / "same" / "model.safetensors"))
    assert all(torch.equal(same[k], wa[k]) for k in wa)
    other = tmp_path / "other"
    checkpoint.save(random_model(0, d_model=32), other, tokenizer_json='{"t": 1}')
    with pytest.raises(ValueError, match="different configs"):
        checkpoint.average([a, other], tmp_path / "x")
    (c / "tokenizer.json").write_text('{"t": 2}')
    with pytest.raises(ValueError, match="different tokenizers"):
        checkpoint.average([a, c], tmp_path / "x")
    with pytest.raises(ValueError, match="at least two"):
        checkpoint.average([a], tmp_path / "x")
    assert not (tmp_path / "x").exists()
