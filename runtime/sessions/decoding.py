"""TurnDecode: one turn's decoding over a session's cache and state, written once for the engine
and the in-process runner: open the region (the input appended, or an infill's holes), step
until it is done, commit the last pending set.  Knows nothing of Redis, SQL or timing."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator

from model.config import ModelConfig
from model.decode import Commit, StepEvent, begin_infill_turn, begin_turn, commit_pending, decode
from model.kv_cache import KVCache
from model.params import DecodeParams, DecodeState
from model.transformer import SetDLM
from runtime.errors import BadInput

#: runs a turn's steps: (cache, state, params) -> its StepEvents until the region is done
Stepper = Callable[[KVCache, DecodeState, DecodeParams], Iterator[StepEvent]]


def infill_holes(cfg: ModelConfig, input_ids: list[int]) -> list[int]:
    """An infill input's hole offsets (where it holds mask_id); BadInput without a hole or with
    an id outside the vocabulary."""
    if not cfg.valid_ids(input_ids, holes=True):
        raise BadInput(f"input ids must be token ids in 0..{cfg.vocab_size - 1} (mask_id {cfg.mask_id} at holes)")
    holes = [i for i, t in enumerate(input_ids) if t == cfg.mask_id]
    if not holes:
        raise BadInput(f"an infill turn needs at least one hole (mask_id {cfg.mask_id})")
    return holes


class TurnDecode:
    """Construction opens the turn (begin_turn, or begin_infill_turn when infill: input_ids holds
    mask_id at holes); a DecodeError there leaves the cache and the state as they were.  steps()
    yields the decoder's StepEvents, then commits the last pending set (one forward), so the
    cache holds every token of the turn."""

    def __init__(self, model: SetDLM, cache: KVCache, state: DecodeState | None, input_ids: list[int],
                 params: DecodeParams, infill: bool = False, commit: Commit | None = None) -> None:
        """commit: who runs the forwards that commit clean tokens (the input's prefill, the last
        set): a Batcher's commit, in its batch; by default model.decode.prefill, here."""
        self.model, self.cache, self.params = model, cache, params
        self.input = list(input_ids)
        self.n0 = cache.length  # the session's slots before this turn
        self.p0 = len(state.tokens) if state is not None else 0  # the input's first position
        self.nfe0 = state.nfe if state is not None else 0
        mask = model.cfg.mask_id
        self.holes = [i for i, t in enumerate(self.input) if t == mask] if infill else None
        self.commit = commit
        if infill:  # its context prefills here (an infill is rare; its input may be long)
            self.state = begin_infill_turn(model, cache, state, self.input, params)
        else:
            self.state = begin_turn(model, cache, state, self.input, params, commit)
        self.start = self.state.start  # the first generated position (infill: the first hole)

    def steps(self, stepper: Stepper | None = None) -> Generator[StepEvent, None, None]:
        """stepper: who runs the steps (a Batcher's steps: this turn in a shared batch); by
        default model.decode.decode, here and alone.  The tokens are the same either way."""
        if stepper is None:
            yield from decode(self.model, self.cache, self.state, self.params)
        else:
            yield from stepper(self.cache, self.state, self.params)
        commit_pending(self.model, self.cache, self.state, self.commit)

    @property
    def tokens(self) -> list[int]:
        """The tokens this turn generated: after the input, or an infill's holes in position
        order (every hole is decoded: no stop cuts an infill region)."""
        if self.holes is not None:
            return [self.state.tokens[self.p0 + i] for i in self.holes]
        return [t for t in self.state.tokens[self.start:] if t != self.model.cfg.mask_id]

    @property
    def row(self) -> list[int]:
        """The turn's token ids as its SQL row keeps them: the input and what followed it, or
        the infill input with its holes filled."""
        return self.state.tokens[self.p0:] if self.holes is not None else self.input + self.tokens

    @property
    def ledger(self) -> list[tuple[int, int]]:
        """(position, token) of the slots this turn committed, in commit order."""
        return list(zip(self.cache.positions[self.n0:], self.cache.tokens[self.n0:]))

    @property
    def nfe(self) -> int:
        """Forward passes of this turn (the state counts the session's)."""
        return self.state.nfe - self.nfe0
