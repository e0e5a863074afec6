"""What a turn is decoded with and where a session's decoding stands: DecodeParams (validated at
construction), DecodeState (JSON beside the K/V), DecodeError.  Plain data, no torch: the API,
the workflows and the store read and write these without loading the model.

DecodeParams is the one field list of a turn's parameters: the API's ParamsSpec is derived from
it (runtime/jobs/params.py), each field's bounds read from its annotation (annotated_types, which
pydantic reads; plain metadata here)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Annotated, Any, Literal, Protocol, get_args

from annotated_types import Ge, Le, Lt, MaxLen, MinLen

Policy = Literal["set", "prefix", "block", "ar"]
POLICIES: tuple[str, ...] = get_args(Policy)
#: a token id as a request may give it: coarse (Qwen3 has 151936 ids); the model's own
#: vocabulary is checked where it is known (workflows/turn.check_ids, the worker)
TokenId = Annotated[int, Ge(0), Lt(2**24)]
#: the bounds a request may ask for, named where another request shape (the Responses API's
#: setflow extension) takes the same fields
Window = Annotated[int, Ge(1), Le(256)]
Tau = Annotated[float, Ge(0.0), Le(1.0)]
Seed = Annotated[int, Ge(0), Lt(2**63)]
#: the metadata of a field a request cannot set (not in ParamsSpec): a Python object, or a
#: switch only the benchmarks turn
INTERNAL = {"api": False}


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


class MaskGuide(Guide, Protocol):
    """A guide that knows every token it allows at once: a grammar's next-token mask
    (workflows/structured/ JsonGuide).  Decoding then takes a refused token's stand-in from the
    whole vocabulary, and a token the mask forces (the only one it allows) with probability 1."""

    def allowed(self, before: Sequence[int]) -> Any:
        """A numpy bool array (vocab,): the tokens that may follow `before`; None: not guided."""
        ...


@dataclass
class DecodeParams:
    """A turn's decoding parameters.  The bounds in the annotations are what a request may ask
    for (the API refuses the rest); __post_init__ checks what decoding itself needs, for every
    caller (a benchmark may pass the API's bounds)."""

    #: "set": sliding window of W positions from the leftmost mask, + tau (the reference's
    #: policy: any confident position of the window, not only the leftmost); "prefix": the same
    #: window, but a step decodes only the unbroken run from the leftmost mask whose every
    #: position clears tau and differs from its left neighbour (see choose); "block": the window
    #: only advances when its fixed block is done (a block-diffusion-style schedule on this same
    #: set-causal model, not BD3LM's in-block attention); "ar": W = 1, tau off
    policy: Policy = "set"
    window: Window = 4  #: W: positions considered per step
    #: confidence threshold; None = off (exactly one token per step)
    tau: Tau | None = 0.9
    max_new_tokens: Annotated[int, Ge(0), Le(4096)] = 64
    temperature: Annotated[float, Ge(0.0), Le(10.0)] = 0.0  #: 0 = greedy
    seed: Seed = 0  #: seeds the session RNG when temperature > 0
    #: stop token sequences
    stop: Annotated[list[Annotated[list[TokenId], MinLen(1), MaxLen(32)]], MaxLen(16)] = field(default_factory=list)
    ignore_eos: bool = False  #: True: EOS does not stop (decode exactly max_new_tokens; benchmarks)
    #: False: recompute every committed token each step (the benchmarks' baseline)
    use_cache: bool = field(default=True, metadata=INTERNAL)
    #: where it guides, a token it refuses is replaced by the most probable one it allows (of the
    #: top GUIDE_TOP; of the whole vocabulary for a MaskGuide); under a guide every step commits the
    #: run from the leftmost mask (policy.py guided)
    guide: Guide | None = field(default=None, compare=False, metadata=INTERNAL)

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

    def to_dict(self) -> dict[str, Any]:
        """Every field but the guide (a Python object, a workflow's: not data), as JSON keeps
        it: DecodeParams(**d) reads it back equal."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "guide"}
        return {**out, "stop": [list(s) for s in self.stop]}  # a copy: the caller may keep it


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
