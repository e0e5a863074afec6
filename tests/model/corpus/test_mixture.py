"""The training mixture: roles, lengths, determinism by step, and the shipped tokenizer."""

import random
from itertools import islice

from domain import agent, narrative, report
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
    assert text_given.startswith(agent.RESULT) and text_given.count(agent.END_RESULT) >= 1
    assert all(r == CONTEXT for r in roles[: roles.index(TARGET)])


def test_infill_examples_have_context_on_both_sides(tok: Tokenizer) -> None:
    import random
    ids, roles = mixture.infill_example(tok, random.Random(2))
    assert roles[-1] == CONTEXT and roles[0] == CONTEXT and TARGET in roles
    last_target = max(i for i, r in enumerate(roles) if r == TARGET)
    assert CONTEXT in roles[last_target:]


def test_the_corpora_reproduce_the_shipped_tokenizer(tok: Tokenizer) -> None:
    assert mixture.train_tokenizer().to_str() == tok.to_str()
    assert tok.vocab_size <= ModelConfig.from_name("small").vocab_size
    assert (shipped.SHIPPED / "tokenizer.json").read_text() == tok.to_str()


def test_the_base_recipe_draws_what_it_drew_before_the_wild_share(tok: Tokenizer) -> None:
    """At share 0 a maker draws exactly its corpus example (no extra random draw), so the base
    recipe's data stream is the one the shipped model was trained on."""
    for seed in range(20):
        for maker, plain in ((mixture.narrative_example, lambda r: narrative.prompt_text(narrative.example(r)[0])),
                             (mixture.agent_example, lambda r: agent.prompt_text(agent.example(r)[0].question)),
                             (mixture.section_example, lambda r: report.section_example(r)[0].prompt_text())):
            a, b = random.Random(seed), random.Random(seed)
            ids, _ = maker(tok, a)
            want = plain(b)
            assert tok.decode(ids, skip_special=True).startswith(want) and a.getstate() == b.getstate()


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


def test_a_fine_tune_draws_its_own_share_of_wild_payloads(tok: Tokenizer) -> None:
    """`setflow train --init ... --wild 1`: every narrative from the API's grammar; --wild 0: every
    one from the corpus's lists, as the base recipe draws them."""
    def batch(wild: float) -> list[list[int]]:
        make = mixture.batches(tok, seed=5, batch_size=3, seq_len=512, finetune=True, mix={"narrative": 1.0},
                               wild=wild)
        return [ids for ids, _ in next(make(2))]

    def drawn(wild: bool) -> list[list[int]]:
        rng = random.Random("mixture/5/2")
        mixture.pick_task(rng, 2, True, {"narrative": 1.0})
        out: list[list[int]] = []
        while len(out) < 3:
            p, text = narrative.wild_example(rng) if wild and rng.random() < 1.0 else narrative.example(rng)
            ids = [tok.bos_id, *tok.encode(narrative.prompt_text(p)), *tok.encode(text), tok.eos_id]
            if len(ids) <= 512:
                out.append(ids)
        return out

    assert batch(1.0) == drawn(True) and batch(0.0) == drawn(False) and batch(1.0) != batch(0.0)


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
        assert given.count(agent.CALL) == 1 and "error: unknown" in given, given
        assert "error" not in targets and targets.count(agent.CALL) == text.count(agent.CALL) - 1, targets
