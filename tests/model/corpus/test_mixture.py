"""The training mixture: roles, lengths, determinism by step, and the shipped tokenizer."""

from itertools import islice

from model import shipped
from model.config import BOS_ID, EOS_ID, ModelConfig
from model.corpus import agent, mixture
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
