"""model/importer.py and `setflow import`: every released layout imports to the same weights and
config; a pickle that is not plain tensors is refused (and runs nothing); --dry-run lists what
maps and what does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from app.cli import main
from model import checkpoint, profiles, shipped
from model.importer import ImportRefused, import_checkpoint, plan_import
from tests.model.released import (
    ENDOFTEXT,
    IM_END,
    LAYOUTS,
    LENGTH,
    MASK,
    QWEN_VOCAB,
    SET_SIZE,
    qwen3_state,
    tokenizer_file,
    write_release,
)


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    return qwen3_state(seed=1)


def _import(layout: str, state: dict[str, torch.Tensor], tmp: Path) -> Path:
    src = write_release(layout, state, tmp / f"src-{layout}")
    tok = tokenizer_file(tmp) if layout == "composer" else None
    import_checkpoint(src, tmp / f"out-{layout}", tokenizer=tok, name="tiny-qwen")
    return tmp / f"out-{layout}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_imports_the_same_weights_and_config(layout: str, state: dict[str, torch.Tensor],
                                                         tmp_path: Path) -> None:
    out = _import(layout, state, tmp_path)
    assert {"model.safetensors", "config.json", "tokenizer.json", "profile.json"} <= {p.name for p in out.iterdir()}
    model, tok = shipped.load(out)
    cfg = model.cfg
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff) == \
        (QWEN_VOCAB, 32, 2, 4, 2, 16, 64)
    assert (cfg.rope_theta, cfg.rms_eps, cfg.tie_embeddings) == (1e6, 1e-6, True)
    assert (cfg.max_seq_len, cfg.set_size, cfg.max_set_size) == (LENGTH, SET_SIZE, 2 * SET_SIZE)
    assert (cfg.mask_id, cfg.bos_id, cfg.eos_id, cfg.pad_id, cfg.doc_start_id) == (MASK, ENDOFTEXT, ENDOFTEXT,
                                                                                   ENDOFTEXT, None)
    assert (tok.mask_id, tok.bos_id, tok.eos_id) == (MASK, ENDOFTEXT, ENDOFTEXT)
    got = model.state_dict()
    for name, t in state.items():
        assert torch.equal(got[name.removeprefix("model.")], t), name
    assert "static_attention_mask" in json.loads((out / "import.json").read_text())["dropped"].popitem()[0]


def test_untied_lm_head_is_kept(tmp_path: Path) -> None:
    state = qwen3_state(seed=2, tie=False)
    model, _ = shipped.load(_import("hf_bin", state, tmp_path))
    assert not model.cfg.tie_embeddings
    assert torch.equal(model.lm_head.weight, state["lm_head.weight"])


def test_a_pickle_that_is_not_plain_tensors_is_refused_and_runs_nothing(state: dict[str, torch.Tensor],
                                                                         tmp_path: Path) -> None:
    src = write_release("hf_bin", state, tmp_path / "src")
    canary = tmp_path / "ran"
    evil = {"backbone.model." + k: v for k, v in state.items()} | {"payload": _Evil(str(canary))}
    torch.save(evil, src / "pytorch_model.bin")
    with pytest.raises(ImportRefused, match="not a pickle of plain tensors.*weights_only=True"):
        import_checkpoint(src, tmp_path / "out")
    assert not canary.exists(), "the pickle ran code"
    assert not (tmp_path / "out").exists(), "a refused import writes nothing"
    assert main(["import", str(src), "--out", str(tmp_path / "out")]) == 2


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))  # would create the file if a loader ran it


def test_dry_run_lists_what_maps_and_what_does_not(state: dict[str, torch.Tensor], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    src = write_release("compiled", state, tmp_path / "src")
    assert main(["import", str(src), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"maps: {len(state)} tensors" in out and "imported as tied embeddings" in out
    assert "drops: static_attention_mask" in out and "config.mask_id = 151660" in out
    assert "config.rope_theta = 1000000.0 <- the public config of Qwen/Qwen3-1.7B-Base" in out
    assert "importable" in out and not list(tmp_path.glob("out*"))
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    sd["backbone._orig_mod.noise_head.weight"] = torch.zeros(2)
    torch.save(sd, src / "pytorch_model.bin")
    assert main(["import", str(src), "--dry-run"]) == 2
    assert "does not map: backbone._orig_mod.noise_head.weight" in capsys.readouterr().out


def test_refusals_say_what_would_do(state: dict[str, torch.Tensor], tmp_path: Path) -> None:
    src = write_release("composer", state, tmp_path / "src")
    plan, _ = plan_import(src)  # a Composer run holds no tokenizer
    assert any("--tokenizer" in p for p in plan.problems)
    cfg = json.loads((write_release("hf_bin", state, tmp_path / "b") / "config.json").read_text())
    cfg["backbone_config"]["pretrained_model_name_or_path"] = "someone/UnknownLM-3B"
    (tmp_path / "b" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ImportRefused, match="--base-config"):
        plan_import(tmp_path / "b")
    with pytest.raises(ImportRefused, match="no reference config"):
        plan_import(_bare(tmp_path))


def _bare(tmp: Path) -> Path:
    folder = tmp / "bare"
    folder.mkdir()
    torch.save({"w": torch.zeros(1)}, folder / "pytorch_model.bin")
    return folder


def test_profile_of_an_imported_chat_model(state: dict[str, torch.Tensor], tmp_path: Path) -> None:
    out = _import("hf_safetensors", state, tmp_path)
    model, tok = shipped.load(out)
    prof = profiles.load(out, model.cfg, tok)
    assert prof.documents == "none" and not prof.bos and prof.stop_ids(tok) == [[IM_END]]
    ids = prof.render("narrative", "the revenue", tok)
    assert ids[0] == tok.token_id("<|im_start|>") and tok.decode(ids).endswith("<|im_start|>assistant\n")


def test_the_shipped_checkpoint_is_untouched_by_the_new_fields() -> None:
    cfg = checkpoint.load_config(shipped.SHIPPED)
    assert cfg.doc_start_id == cfg.bos_id == 2
    assert json.loads(cfg.to_json()) == json.loads((shipped.SHIPPED / "config.json").read_text())
