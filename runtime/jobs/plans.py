"""What the API and the workflows share of a job's input below the workflows (no torch): a
turn's and an agent's first input as the profile renders them, and the check of a spec's token
ids against the model's vocabulary.  Each kind's plan (the positions a job appends at most) and
the rest of its input live with its workflow (workflows.PLANS)."""

from __future__ import annotations

from domain import agent as agent_corpus
from model.config import ModelConfig
from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.errors import BadInput

DEFAULT = Profile()  # setflow's own models' profile: BOS, then the prompt as it is; no extra stops


def agent_input(tok: Tokenizer, question: str, profile: Profile = DEFAULT) -> list[int]:
    """An agent's first input: the profile's `agent` format around the question."""
    return profile.render("agent", agent_corpus.prompt_text(question), tok)


def turn_input(profile: Profile, tok: Tokenizer, text: str) -> list[int]:
    """A turn's text input: the profile's `turn` format around it, no BOS (a turn continues its
    session; setflow's models: the text's ids as they are)."""
    return profile.render("turn", text, tok, bos=False) if text else []


def check_ids(spec: object, cfg: ModelConfig) -> None:
    """BadInput for a token id the model cannot take: the input's ids and the stop sequences'
    must lie in its vocabulary, and none may be the mask id (a hole is an infill's)."""
    ids = list(getattr(spec, "input_ids", None) or [])
    params = getattr(spec, "params", None)
    ids += [t for seq in (params.stop if params is not None else []) for t in seq]
    if not cfg.valid_ids(ids):
        raise BadInput(f"token ids must be in [0, {cfg.vocab_size}) and not the mask id {cfg.mask_id} (holes: infill)")
