"""What a turn is decoded with and where a session's decoding stands: DecodeParams (validated at
construction), DecodeState (JSON beside the K/V), DecodeError.  Plain data, no torch: the API,
the workflows and the store read and write these without loading the model."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

POLICIES = ("set", "prefix", "block", "ar")


class DecodeError(ValueError):
    """Bad decode input: invalid parameters, or a request past the model's context."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code  #: stable reason: "params", "context_overflow", "state"


class Guide(Protocol):
    """Which tokens a position may take, as a pure function of the tokens before it: a workflow's
    grammar (workflows/tools.py CallGuide: a tool call's arguments copied from the question).  It
    must be deterministic, so that cached, batched, restored and recomputed decoding agree."""

    def allows(self, before: Sequence[int], token: int) -> bool | None:
        """before: the region's tokens up to the position (all decoded, or chosen left of it in
        this step).  None: the position is not guided (any token); else whether token may follow."""
        ...


@dataclass
class DecodeParams:
    #: "set": sliding window of W positions from the leftmost mask, + tau (the reference's
    #: policy: any confident position of the window, not only the leftmost); "prefix": the same
    #: window, but a step decodes only the unbroken run from the leftmost mask whose every
    #: position clears tau and differs from its left neighbour (see choose); "block": the window
    #: only advances when its fixed block is done (a block-diffusion-style schedule on this same
    #: set-causal model, not BD3LM's in-block attention); "ar": W = 1, tau off
    policy: str = "set"
    window: int = 4  #: W: positions considered per step
    tau: float | None = 0.9  #: confidence threshold; None = off (exactly one token per step)
    max_new_tokens: int = 64
    temperature: float = 0.0  #: 0 = greedy
    seed: int = 0  #: seeds the session RNG when temperature > 0
    stop: list[list[int]] = field(default_factory=list)  #: stop token sequences
    ignore_eos: bool = False  #: True: EOS does not stop (decode exactly max_new_tokens; benchmarks)
    use_cache: bool = True  #: False: recompute every committed token each step (the baseline)
    #: where it guides, a token it refuses is replaced by the most probable one it allows (of the
    #: top GUIDE_TOP); under a guide every step commits the run from the leftmost mask (decode.py guided)
    guide: Guide | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise DecodeError("params", f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.policy == "ar":
            self.window, self.tau = 1, None
        if not isinstance(self.window, int) or self.window < 1:
            raise DecodeError("params", f"window must be an integer >= 1, got {self.window!r}")
        if self.max_new_tokens < 0:
            raise DecodeError("params", f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise DecodeError("params", f"temperature must be >= 0, got {self.temperature}")
        if any(not s for s in self.stop):
            raise DecodeError("params", "stop sequences must be non-empty")


@dataclass
class DecodeState:
    tokens: list[int]  # token id at every position 0..len-1; mask_id where not decoded yet
    pending: list[int] = field(default_factory=list)  # positions decoded, K/V not in the cache yet (commit order)
    start: int = 0  # first position of the current decode region (fixed blocks align to it)
    step: int = 0  # steps taken in this region
    nfe: int = 0  # forward passes so far (prefills included)
    done: bool = True  # no open region
    rng: str | None = None  # base64 torch.Generator state, when sampling
    infill: bool = False  # an infill region: fixed holes, no stop criteria

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DecodeState:
        return cls(**json.loads(text))
