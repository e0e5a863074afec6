"""The training mixture: roles, lengths, determinism by step, and the shipped tokenizer."""

import random
from itertools import islice

import pytest

from domain.facts import SLOT, slots_in
from domain.markup import SLOT_TOKENS
from domain.tools import CALL, END_RESULT, RESULT
from model import shipped
from model.config import BOS_ID, EOS_ID, ModelConfig
from model.corpus import mixture
from model.tokenizer import Tokenizer
from model.train import CONTEXT, GIVEN, TARGET, roles_of


def test_batches_depend_only_on_the_step_and_fit_the_length(tok: Tokenizer) -> None:
    make = mixture.batches(tok, seed=0, batch_size=4, seq_len=320)
    straight = list(islice(make(0), 12))
    assert list(islice(make(9), 3)) == straight[9:12]
    for batch in straight:
        for ex in batch:
            ids, roles = ex[0], roles_of(ex)
            assert len(ids) <= 320 and ids[0] == BOS_ID and ids[-1] == EOS_ID
            assert roles[0] == CONTEXT and TARGET in roles


def test_tool_results_are_given_not_targets(tok: Tokenizer) -> None:
    import random
    ids, roles = mixture.agent_example(tok, random.Random(4))
    text_given = tok.decode([i for i, r in zip(ids, roles) if r == GIVEN])
    assert text_given.startswith(RESULT) and text_given.count(END_RESULT) >= 1
    assert all(r == CONTEXT for r in roles[: roles.index(TARGET)])


def test_infill_examples_have_context_on_both_sides(tok: Tokenizer) -> None:
    import random
    ids, roles = mixture.infill_example(tok, random.Random(2))
    assert roles[-1] == CONTEXT and roles[0] == CONTEXT and TARGET in roles
    last_target = max(i for i, r in enumerate(roles) if r == TARGET)
    assert CONTEXT in roles[last_target:]


def test_the_shipped_tokenizer_holds_every_slot_after_its_vocabulary(tok: Tokenizer) -> None:
    """The shipped tokenizer is the one learnt from the corpora before facts were slots, with the
    slots added after its last id (`setflow train --init` adds them); one learnt anew ends the same."""
    ids = [tok.token_id(t) for t in SLOT_TOKENS]
    assert ids == list(range(tok.vocab_size - len(SLOT_TOKENS), tok.vocab_size))
    assert tok.vocab_size <= ModelConfig.from_name("small").vocab_size
    assert (shipped.SHIPPED / "tokenizer.json").read_text() == tok.to_str()
    assert tok.encode("rose [F4] to [F96].") == [*tok.encode("rose "), ids[3], *tok.encode(" to "), ids[95], *tok.encode(".")]
    fresh = mixture.train_tokenizer()
    assert [fresh.token_id(t) for t in SLOT_TOKENS] == list(range(fresh.vocab_size - len(SLOT_TOKENS), fresh.vocab_size))


def test_facts_are_slots_the_prompt_holds_and_tables_start_anywhere(tok: Tokenizer) -> None:
    """What a narrative, a section or the key figures write of a fact is a slot of its prompt's
    table, never its text; half the tables start past [F1], so every slot is learnt."""
    firsts = []
    for seed in range(60):
        for maker in (mixture.narrative_example, mixture.section_example, mixture.infill_example):
            ids, roles = maker(tok, random.Random(seed))
            prompt = tok.decode([t for t, r in zip(ids, roles) if r == CONTEXT], skip_special=True)
            written = tok.decode([t for t, r in zip(ids, roles) if r == TARGET], skip_special=True)
            held = slots_in(prompt)
            assert set(slots_in(written)) <= set(held) and not any(ch.isdigit() for ch in SLOT.sub("", written))
            firsts.append(held[0])
    assert 0.3 < sum(f != "[F1]" for f in firsts) / len(firsts) < 0.7


def test_a_fine_tune_draws_its_tasks_by_its_own_mix(tok: Tokenizer) -> None:
    """`setflow train --init ... --mix agent=1`: every batch an agent one (the default mix draws
    all four tasks); the same step draws the same batch."""
    assert mixture.parse_mix("narrative=0.35, agent=0.35,section=0.15,infill=0.15") == {
        "narrative": 0.35, "agent": 0.35, "section": 0.15, "infill": 0.15}
    rng = random.Random(0)
    assert {mixture.pick_task(rng, s, finetune=True) for s in range(200)} == set(mixture.FINETUNE_MIX)
    make = mixture.batches(tok, seed=3, batch_size=2, seq_len=512, finetune=True, mix={"agent": 1.0})
    batches = list(islice(make(0), 6))
    assert list(islice(make(4), 2)) == batches[4:]
    for batch in batches:
        for ids, _ in batch:
            assert tok.decode(ids, skip_special=True).startswith("Q: ")  # agent.prompt_text: a question


def test_a_fine_tune_draws_its_own_share_of_wild_payloads(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`setflow train --init ... --wild 1`: every narrative from the API's grammar; --wild 0: every
    one from the corpus's lists, as the base recipe draws them."""
    drawn: list[str] = []
    for name in ("wild_payload", "make_payload"):
        real = getattr(mixture, name)
        monkeypatch.setattr(mixture, name, lambda rng, _real=real, _name=name: drawn.append(_name) or _real(rng))

    def batch(wild: float) -> list[list[int]]:
        drawn.clear()
        make = mixture.batches(tok, seed=5, batch_size=3, seq_len=512, finetune=True, mix={"narrative": 1.0},
                               wild=wild)
        return [ids for ids, _ in next(make(2))]

    assert batch(1.0) != batch(0.0) and set(drawn) == {"make_payload"}
    batch(1.0)
    assert set(drawn) == {"wild_payload"} and len(drawn) >= 3


def test_a_fine_tune_mends_its_own_share_of_miscopied_calls(tok: Tokenizer) -> None:
    """`--slip 1`: every wild agent transcript first miscopies a name (given: no loss), reads the
    error with its hint (given), then writes the right call (a target); --slip 0 draws what the
    stages before it drew."""
    def batch(slip: float) -> list[mixture.Example]:
        make = mixture.batches(tok, seed=5, batch_size=4, seq_len=512, finetune=True, mix={"agent": 1.0},
                               wild=1.0, slip=slip)
        return next(make(2))

    plain = mixture.batches(tok, seed=5, batch_size=4, seq_len=512, finetune=True, mix={"agent": 1.0}, wild=1.0)
    assert batch(0.0) == next(plain(2))
    for ids, roles in batch(1.0):
        text = tok.decode(ids)
        assert text.count("did you mean") + text.count("error: unknown") >= 1, text
        # the slipped call and its result are given: no loss on a miscopy; the mended call is a target
        given = tok.decode([t for t, r in zip(ids, roles, strict=True) if r == GIVEN])
        targets = tok.decode([t for t, r in zip(ids, roles, strict=True) if r == TARGET])
        assert given.count(CALL) == 1 and "error: unknown" in given, given
        assert "error" not in targets and targets.count(CALL) == text.count(CALL) - 1, targets


def test_a_fine_tune_says_the_drivers_in_its_own_share_of_narratives(tok: Tokenizer) -> None:
    """`--drivers 1`: every narrative whose breakdown's metric changed reads the drivers' line
    and says them after its breakdown's sentence; --drivers 0 draws what the stages before it drew."""
    def batches(drivers: float) -> list[mixture.Example]:
        make = mixture.batches(tok, seed=5, batch_size=4, seq_len=640, finetune=True, mix={"narrative": 1.0},
                               wild=0.5, drivers=drivers)
        return [ex for batch in islice(make(3), 4) for ex in batch]

    plain = mixture.batches(tok, seed=5, batch_size=4, seq_len=640, finetune=True, mix={"narrative": 1.0}, wild=0.5)
    assert batches(0.0) == [ex for batch in islice(plain(3), 4) for ex in batch]
    said = 0
    for ids, roles in batches(1.0):
        prompt = tok.decode([t for t, r in zip(ids, roles, strict=True) if r == CONTEXT])
        target = tok.decode([t for t, r in zip(ids, roles, strict=True) if r == TARGET])
        asked = "\ndrivers: largest " in prompt
        assert ("the change" in target) == asked, (prompt, target)  # each of the drivers' forms says it
        said += asked
    assert said >= 1
