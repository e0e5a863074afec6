"""A model's profile (`profile.json` beside its weights): how each workflow renders its prompt for
this model, which tokens stop a generation, and the document-start rule.

The shipped model's profile is the format it was trained on (BOS, then the prompt as it is); an
instruction-tuned import gets its chat template.  Knows tokens and text, nothing of decoding.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from domain.markup import SLOT_TOKENS
from model.config import ModelConfig
from model.tokenizer import Tokenizer

PROFILE = "profile.json"
PROMPT = "{prompt}"  # where a format puts the workflow's prompt text
# Qwen's chat format (ChatML), as its tokenizer_config's chat_template renders one user turn
CHATML = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


@dataclass
class Profile:
    bos: bool = True  # a prompt starts with the BOS id
    formats: dict[str, str] = field(default_factory=dict)  # workflow kind -> format; others: PROMPT
    stop: list[str] = field(default_factory=list)  # tokens that end a generation besides EOS
    documents: str = "bos"  # "bos": a BOS key starts a document; "none": no boundaries
    #: "slots": facts enter the prompt as slot tokens and the model writes slots (setflow's
    #: models, domain/facts.py); "text": facts written out, and the model's text read back into
    #: slots for the same checkers (a model whose vocabulary has no slots: load() sets it)
    facts: str = "slots"

    def __post_init__(self) -> None:
        if self.documents not in ("bos", "none"):
            raise ValueError(f"documents must be 'bos' or 'none', not {self.documents!r}")
        if self.facts not in ("slots", "text"):
            raise ValueError(f"facts must be 'slots' or 'text', not {self.facts!r}")
        bad = [k for k, f in self.formats.items() if f.count(PROMPT) != 1]
        if bad:
            raise ValueError(f"formats {bad} must hold {PROMPT} exactly once")

    def render(self, kind: str, text: str, tok: Tokenizer, *, bos: bool | None = None) -> list[int]:
        """The prompt ids of workflow `kind` for `text`.  bos: whether the prompt starts with the
        BOS id (None: the profile's rule; a turn that continues a session passes False)."""
        before, after = self.formats.get(kind, PROMPT).split(PROMPT)
        ids = [tok.bos_id] if (self.bos if bos is None else bos) else []
        # the format's pieces and the text encoded apart: markup in the format is its own ids,
        # and the user's text cannot merge with it
        return ids + tok.encode(before) + tok.encode(text) + tok.encode(after)

    def stop_ids(self, tok: Tokenizer) -> list[list[int]]:
        """The stops as stop sequences: a token of the vocabulary is its one id, any other text
        its encoding (several ids: a multi-token stop sequence)."""
        return [[tok.token_id(t)] if tok.has_token(t) else tok.encode(t) for t in self.stop if t]

    @staticmethod
    def markup(tok: Tokenizer, text: str) -> list[int]:
        """A workflow's markup (`<call>`, `</call>`, `<result>`) as ids: one id where the
        vocabulary has it as a token (setflow's own), else its encoding (an imported model's)."""
        return [tok.token_id(text)] if tok.has_token(text) else tok.encode(text)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        return cls(**json.loads(text))

    @classmethod
    def for_model(cls, cfg: ModelConfig, tok: Tokenizer) -> Profile:
        """The default for a model: setflow's own format when its vocabulary is setflow's, the chat
        template when it has ChatML's tokens, else the prompt as it is (no BOS: Qwen adds none)."""
        documents = "none" if cfg.doc_start_id is None else "bos"
        facts = "slots" if reads_slots(tok) else "text"
        if tok.has_token("[BOS]") and tok.token_id("[BOS]") == cfg.bos_id:
            return cls(bos=True, documents=documents, facts=facts)
        if tok.has_token("<|im_start|>") and tok.has_token("<|im_end|>"):
            return cls(bos=False, formats={k: CHATML for k in ("turn", "narrative", "agent", "report")},
                       stop=["<|im_end|>"], documents=documents, facts=facts)
        return cls(bos=False, documents=documents, facts=facts)


def reads_slots(tok: Tokenizer) -> bool:
    """Whether a vocabulary holds every fact slot as a token of its own."""
    return all(tok.has_token(t) for t in SLOT_TOKENS)


def load(folder: str | Path, cfg: ModelConfig, tok: Tokenizer) -> Profile:
    """The profile beside a checkpoint's weights, or the model's default where there is none."""
    path = Path(folder) / PROFILE
    profile = Profile.from_json(path.read_text()) if path.is_file() else Profile.for_model(cfg, tok)
    # a model cannot read or write slots its vocabulary lacks, whatever a profile says
    return profile if reads_slots(tok) else replace(profile, facts="text")
