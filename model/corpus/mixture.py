"""The shipped model's training data: the three use-case corpora mixed, tokenized, batched.

Every example is [BOS] prompt target [EOS] with a role per token (model.train.Example):
CONTEXT (the prompt, the context of a template), TARGET (what the model learns to write),
GIVEN (tool results: in the sequence, after the call, but written by the runtime, so no loss).
Batch s is drawn from its own RNG seeded by (seed, s): a resumed run sees the same data.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator

from domain import agent, narrative, report
from domain.agent_facts import in_slots
from domain.draws import make_payload, wild_payload
from domain.drivers import rendered
from domain.facts import Slots
from domain.markup import N_SLOTS, SLOT_TOKENS
from domain.report import infill_tokens
from domain.tools import SAMPLE_NAMES, held_names
from model.tokenizer import Tokenizer
from model.train import CONTEXT, GIVEN, TARGET, Example

# task -> share of the training examples
MIX = {"narrative": 0.40, "agent": 0.35, "section": 0.13, "infill": 0.12}
# Curriculum: the first COPY_WARMUP steps draw only agent transcripts (short, and mostly copying
# digits from the question or a tool result).  On the full mixture from the start, a model of
# this size had not learnt to copy a number after 6000 steps (docs/BENCHMARKS.md); on agent
# transcripts alone it learns to in a few hundred steps, and the skill carries over.
COPY_WARMUP = 800
WARMUP_MIX = {"agent": 1.0}
TOKENIZER_TEXTS = 20000  # examples the tokenizer is learnt from (seed TOKENIZER_SEED)
TOKENIZER_SEED = 12345
# what trains the `small` preset in about an hour on 2 cores: TrainConfig keywords
RECIPE = dict(steps=8600, batch_size=8, seq_len=384, lr=4e-3, warmup=100, log_every=20, ckpt_every=200)
# The fine-tune that widens a trained model to the API's whole grammar (`setflow train --init
# DIR`): WILD of the narratives and sections are drawn from wild_payload (any names,
# periods, custom metrics, numbers of 1-9 digits with up to 3 decimals) and of the agent
# questions from agent.wild_task, the rest as before, so that what the model knew stays in its
# data; longer sequences (wild payloads are longer), a lower peak learning rate.  The shipped
# model is the base model fine-tuned so in stages: 8000 steps (1 h 24 min on the 2 cores,
# shared), then from that 6500 steps of seed 1 with `--mix narrative=0.35,agent=0.35,
# section=0.15,infill=0.15` (1 h 23 min), then 8000 steps of seed 3 at half the peak learning
# rate, `--lr 7.5e-4 --mix narrative=0.35,agent=0.4,section=0.15,infill=0.1` (1 h 13 min), then
# 5500 of seed 5 with `--wild 0.85` (1 h 11 min); the shipped weights are the mean of the last
# two (`setflow average`): README "The shipped model".  A stage 6 with `--slip 0.35` (transcripts
# that mend a miscopied call) was tried and not shipped (docs/BENCHMARKS.md).
FINETUNE = dict(steps=8000, batch_size=8, seq_len=640, lr=1.5e-3, warmup=50, log_every=20, ckpt_every=50)
FINETUNE_MIX = {"narrative": 0.45, "agent": 0.2, "section": 0.2, "infill": 0.15}
WILD = 0.6
VOCAB_SIZE = 896  # an upper bound: the corpora's words need fewer merges (the small preset's vocab_size)


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text)


def _wild(rng: random.Random, share: float) -> bool:
    """Draw from the API's grammar this time?  No draw at all at share 0: the base recipe's
    data stream stays the one the shipped model was trained on."""
    return share > 0 and rng.random() < share


# Slot tables: a job's table starts at [F1], so a narrative of a few metrics never reaches the
# slots that only 8 metrics and 12 rows do; half the training tables start at a random later slot,
# so that every slot is learnt as a token to copy, not as a place in the payload.
SHIFTED = 0.5


def _table(rng: random.Random, facts: int) -> Slots:
    """An empty slot table for an input of `facts` facts: at [F1], or SHIFTED of the time further on."""
    return Slots(first=rng.randint(0, N_SLOTS - facts)) if rng.random() < SHIFTED else Slots()


def narrative_example(tok: Tokenizer, rng: random.Random, wild: float = 0.0, drivers: float = 0.0) -> Example:
    """drivers: the share whose payload asks for its breakdown's drivers (a narrative at detail
    `full`: domain/narrative.py drivers_form)."""
    p = wild_payload(rng) if _wild(rng, wild) else make_payload(rng)
    said = _wild(rng, drivers)
    r = rendered(p, _table(rng, len(rendered(p, said=said).slots.texts)), said)
    prompt = [tok.bos_id, *_ids(tok, narrative.prompt_of(r))]
    target = [*_ids(tok, narrative.write(rng, narrative.narrative_form(r))), tok.eos_id]
    return prompt + target, [CONTEXT] * len(prompt) + [TARGET] * len(target)


AGENT_FACTS = 16  # slots an agent transcript takes at most: its question's names and its results
# the share of agent questions whose names stay text (only the results are slots): a question over
# a source the runtime cannot read (a metric tool the client runs) keeps its names as text, and
# the model copies them under the guide as before
NAMES_AS_TEXT = 0.15


def agent_example(tok: Tokenizer, rng: random.Random, wild: float = 0.0, slip: float = 0.0) -> Example:
    """In slot form (domain/agent_facts.py): the question's names its source holds and each
    result are slots.  slip: the share of wild questions whose transcript mends a miscopied call
    (agent.slipped: a name the question holds but no source knows stays text, and may slip)."""
    if _wild(rng, wild):
        task, store, pieces = agent.wild_example(rng)
        if _wild(rng, slip):
            pieces = agent.slipped(task, store, rng)
        held: list[str] = [n for names in held_names(store.values) for n in names]
    else:
        task, _, pieces = agent.example(rng)
        held = [n for names in SAMPLE_NAMES for n in names]
    if rng.random() < NAMES_AS_TEXT:
        held = []
    facts, pieces = in_slots(task, pieces, held, _table(rng, AGENT_FACTS).first)
    ids = [tok.bos_id, *_ids(tok, agent.prompt_text(facts.question))]
    roles = [CONTEXT] * len(ids)
    for text, given in pieces:
        piece = _ids(tok, text)
        ids += piece
        roles += [GIVEN if given else TARGET] * len(piece)
    return ids + [tok.eos_id], roles + [TARGET]


def section_example(tok: Tokenizer, rng: random.Random, wild: float = 0.0) -> Example:
    s = report.make_section(rng, wild=_wild(rng, wild))
    first = _table(rng, len(s.render()[2].slots.texts)).first
    prompt = [tok.bos_id, *_ids(tok, s.prompt_text(Slots(first=first)))]
    target = [*_ids(tok, report.section_text(rng, s, Slots(first=first))), tok.eos_id]
    return prompt + target, [CONTEXT] * len(prompt) + [TARGET] * len(target)


def infill_example(tok: Tokenizer, rng: random.Random, wild: float = 0.0) -> Example:
    p = wild_payload(rng) if _wild(rng, wild) else make_payload(rng)
    p.breakdown = None
    ids, hole = infill_tokens(tok, report.template(p, _table(rng, len(p.render().slots.texts))))
    return ids, [TARGET if h else CONTEXT for h in hole]


MAKERS: dict[str, Callable[[Tokenizer, random.Random], Example]] = {
    "narrative": narrative_example, "agent": agent_example, "section": section_example, "infill": infill_example}
# the makers that draw some of their data from the API's grammar (their share of wild payloads)
WILD_MAKERS: dict[str, Callable[[Tokenizer, random.Random, float], Example]] = {
    "narrative": narrative_example, "section": section_example, "agent": agent_example, "infill": infill_example}


def pick_task(rng: random.Random, step: int, finetune: bool = False, mix: dict[str, float] | None = None) -> str:
    """mix: a fine-tune's own shares (default FINETUNE_MIX)."""
    shares = (mix or FINETUNE_MIX) if finetune else WARMUP_MIX if step < COPY_WARMUP else MIX
    return rng.choices(list(shares), weights=list(shares.values()))[0]


def parse_mix(text: str) -> dict[str, float]:
    """"narrative=0.4,agent=0.3,..." -> shares (ValueError with the reason: an unknown task, a
    share that is not a number >= 0, none above 0)."""
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in MAKERS:
            raise ValueError(f"{part!r}: expected task=share with a task of {', '.join(MAKERS)}")
        try:
            share = float(value)
        except ValueError:
            raise ValueError(f"{part!r}: the share is not a number") from None
        if not share >= 0 or share == float("inf"):
            raise ValueError(f"{part!r}: a share is a finite number >= 0")
        out[name] = share
    if not any(out.values()):
        raise ValueError(f"{text!r}: no task has a share above 0")
    return out


def texts(seed: int = TOKENIZER_SEED, n: int = TOKENIZER_TEXTS) -> Iterator[str]:
    """Plain texts of every task, for learning the tokenizer: facts written out (the slots are
    tokens of their own, added after: train_tokenizer)."""
    rng = random.Random(seed)
    for i in range(n):
        kind = list(MIX)[i % len(MIX)]
        if kind == "narrative":
            p, t = narrative.example(rng)
            yield p.render().slots.lexicalise(narrative.prompt_text(p) + t)
        elif kind == "agent":
            task, _, pieces = agent.example(rng)
            yield agent.prompt_text(task.question) + "".join(t for t, _ in pieces)
        elif kind == "section":
            s, t = report.section_example(rng)
            yield s.render()[2].slots.lexicalise(s.prompt_text() + t)
        else:
            tpl = report.make_template(rng)
            yield tpl.rendered.slots.lexicalise(tpl.context_text() + tpl.text())


def train_tokenizer(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """BPE learnt from the corpora's texts, then the fact slots.  The shipped tokenizer is the
    one learnt from the corpora before facts were slots, with the slots added after its last id
    (`setflow train --init` adds them to a base that lacks them): its ids are the weights'."""
    return Tokenizer.train(texts(), vocab_size - len(SLOT_TOKENS)).with_tokens(SLOT_TOKENS)


def batches(tok: Tokenizer, seed: int, batch_size: int, seq_len: int,
            finetune: bool = False, mix: dict[str, float] | None = None,
            wild: float | None = None, slip: float = 0.0, drivers: float = 0.0
            ) -> Callable[[int], Iterator[list[Example]]]:
    """`train()`'s data.  A batch holds one task (drawn by WARMUP_MIX, then MIX), so that short agent transcripts
    are not padded to the length of long narratives.  Examples longer than seq_len are dropped
    (and redrawn), not cropped: a cropped narrative would teach the model to stop mid-sentence.
    A fine-tune's mix and wild (default FINETUNE_MIX, WILD) set its task shares and the share of
    wild payloads; slip the share of wild agent questions that mend a miscopied call, drivers the
    share of narratives that say their breakdown's drivers (default 0: the data stream of the
    stages before them: a share of 0 draws nothing)."""
    share = WILD if wild is None else wild
    makers: dict[str, Callable[[Tokenizer, random.Random, float], Example]] = {
        **WILD_MAKERS, "agent": functools.partial(agent_example, slip=slip),
        "narrative": functools.partial(narrative_example, drivers=drivers)}
    def from_step(start: int) -> Iterator[list[Example]]:
        s = start
        while True:
            rng = random.Random(f"mixture/{seed}/{s}")  # str seeds hash deterministically
            task = pick_task(rng, s, finetune, mix)
            wild = share if finetune and task in WILD_MAKERS else 0.0
            out: list[Example] = []
            while len(out) < batch_size:
                ex = makers[task](tok, rng, wild)  # wild 0 and no slip or drivers: MAKERS' stream
                if len(ex[0]) <= seq_len:
                    out.append(ex)
            yield out
            s += 1
    return from_step
