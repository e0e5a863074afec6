"""The Turns seam every workflow is written over, and the simplest jobs on it: one turn (the input
as token ids or text) and one infill (a template whose `<hole>` markers are decoded in place).
Also the helpers every workflow shares: a turn's text input as the profile renders it, decode
parameters from their JSON, a turn's summary, a fill, an input's facts as the profile's model
reads and writes them, and the API's checks of a job before it is queued: its token ids against
the model's vocabulary, and its plan (the positions it appends at most: workflows.PLANS) against
the context.  Who runs the turns
(a job's session, or a session in this process) is not known here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from domain.facts import Slots
from model.config import ModelConfig
from model.params import DecodeError, DecodeParams
from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.errors import BadInput
from runtime.jobs.params import ParamsSpec
from runtime.jobs.specs import HOLE, InfillSpec, TurnSpec
from runtime.sessions.turn import TurnResult

DEFAULT = Profile()  # setflow's own models' profile: BOS, then the prompt as it is; no extra stops


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

class Turns(Protocol):
    """One session's turns, as a workflow sees them: the job context's (runtime/jobs/context.py,
    the job's session in Redis and SQL) or the in-process runner's (runtime/sessions/local.py)."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def cfg(self) -> ModelConfig:
        """The model's: bos_id, eos_id, mask_id, vocab_size, max_seq_len (read-only members: a
        plain attribute satisfies them too)."""
        ...

    @property
    def profile(self) -> Profile:
        """How this model's prompts are rendered and which tokens stop it (model/profiles.py:
        the profile beside its weights, or its default)."""
        ...

    def turn(self, ids: list[int], params: DecodeParams, *, text: str = "", infill: bool = False,
             facts: Slots | None = None) -> TurnResult:
        """Append `ids` to the session and decode after them (infill: `ids` holds mask_id at
        holes, decoded in place); text: the input as rendered, for the session's record; facts:
        the input's slot table, so that what watchers see of each step has its facts written out."""
        ...

    def used(self) -> int:
        """Positions the session holds before this job's own turns."""
        ...

    def tool_output(self, call_id: str) -> str | None:
        """The output the client sent for the call `call_id` of a tool it runs (an agent's
        client_tools); None: none yet."""
        ...

    def once(self, key: str, fn: Callable[[], Any]) -> Any:
        """fn()'s result, recorded the first time the job asks for `key` and replayed on every
        run after (a retry, on any worker), as a Temporal activity's: for a side effect a rerun
        must not repeat, or whose answer may have changed meanwhile (a tenant's dataset read by
        a tool).  JSON both ways (runtime/sessions/once.py): the first run gets what a replay reads."""
        ...

    def dataset(self, name: str) -> list[list[str]]:
        """The job's tenant's dataset `name`: rows of [metric, region, period, value];
        NotFound where there is none."""
        ...

    def report(self, **progress: Any) -> None:
        """Progress for whoever watches (sections done, calls made)."""
        ...

    def checked(self, part: str, outcome: str) -> None:
        """A checked part's outcome (workflows/checked.py: "first", "ar_retry", "unverified",
        "flagged"), counted for /metrics."""
        ...


def decode_params(p: ParamsSpec) -> DecodeParams:
    try:
        return DecodeParams(**p.model_dump())
    except DecodeError as e:
        raise BadInput(str(e)) from None


def with_stops(turns: Turns, params: DecodeParams, *more: list[int]) -> DecodeParams:
    """params with `more` stop sequences and the profile's (none for setflow's own models: the
    same params) added after its own."""
    extra = [s for s in [*more, *turns.profile.stop_ids(turns.tokenizer)] if s not in params.stop]
    return replace(params, stop=[*params.stop, *extra]) if extra else params


def ended(turns: Turns, tokens: list[int]) -> bool:
    """The turn ended its answer: at EOS or at one of the profile's stops."""
    ends = [[turns.cfg.eos_id], *turns.profile.stop_ids(turns.tokenizer)]
    return any(tokens[-len(e):] == e for e in ends if len(tokens) >= len(e))


def text_of(turns: Turns, tokens: list[int]) -> str:
    """What a turn wrote, as text: its special ids and a final profile stop (a chat model's
    end-of-turn token) left out."""
    for stop in turns.profile.stop_ids(turns.tokenizer):
        if len(tokens) >= len(stop) and tokens[-len(stop):] == stop:
            tokens = tokens[:-len(stop)]
            break
    return turns.tokenizer.decode(tokens, skip_special=True)


def summary(r: TurnResult) -> dict[str, Any]:
    """What a result says of one turn: where it is, how the session was loaded, its costs."""
    return {"turn": r.turn, "path": r.path, "tokens": len(r.tokens), "nfe": r.nfe,
            "load_ms": round(1000 * r.costs.get("load_s", 0.0), 3),
            "decode_ms": round(1000 * r.costs.get("decode_s", 0.0), 3), "events": r.events}


def fill(turns: Turns, masked: list[int], params: DecodeParams, text: str = "") -> tuple[list[int], TurnResult]:
    """One infill turn: `masked` holds mask_id at the holes; returns it filled, and the turn."""
    r = turns.turn(masked, params, text=text, infill=True)
    return filled(masked, r, turns.cfg.mask_id), r


def filled(masked: list[int], r: TurnResult, mask_id: int) -> list[int]:
    """`masked` with its holes (mask_id) replaced by what the infill turn `r` decoded there."""
    holes = iter(r.tokens)  # the holes' tokens, in position order
    return [next(holes) if t == mask_id else t for t in masked]


# ---- an input's facts, as the profile's model reads and writes them ------------------------------
# Facts enter as the model's profile says (Profile.facts): as slot tokens, whose table each input
# returns beside its ids (domain/facts.py: the workflow lexicalises what the model writes with
# it), or written out, for a model that copies them (its text is read back into the same slots).


def facts_table(profile: Profile) -> Slots:
    """An input's empty slot table (one slot per distinct text where the model writes facts as text)."""
    return Slots(dedup=profile.facts == "text")


def readable(profile: Profile, slots: Slots, text: str) -> str:
    """An input in slot form as the profile's model reads it: its slots, or its facts written out."""
    return text if profile.facts == "slots" else slots.lexicalise(text)


def slot_form(profile: Profile, slots: Slots, written: str) -> str:
    """What the model wrote, in slot form for the checkers (a text model's facts read back)."""
    return written if profile.facts == "slots" else slots.delexicalise(written)


def written_out(profile: Profile, slots: Slots, written: str) -> str:
    """What the model wrote, with its facts written out: what the job returns."""
    return slots.lexicalise(written) if profile.facts == "slots" else written


# ---- a job's plan: the positions it appends to its session at most ---------------------------------


def planned(spec: TurnSpec, tok: Tokenizer, profile: Profile = DEFAULT) -> int:
    """A turn's: its input and what it may decode."""
    n = len(spec.input_ids) if spec.input_ids is not None else len(turn_input(profile, tok, spec.text or ""))
    return n + spec.params.max_new_tokens


def infill_planned(spec: InfillSpec, tok: Tokenizer, profile: Profile = DEFAULT) -> int:
    """An infill's: its text (the holes are inside it)."""
    return len(tok.encode(spec.text))


def fits(kind: str, need: int, used: int, max_seq_len: int) -> int:
    """`need`, the positions a job of `kind` appends at most; BadInput when they cannot fit:
    `used` positions of the session are taken already."""
    if used + need > max_seq_len:
        raise BadInput(f"context_overflow: this {kind} needs up to {need} positions and the session has "
                       f"{max_seq_len - used} of {max_seq_len} left (fewer sections, shorter inputs or a smaller "
                       f"max_new_tokens, or a new session)")
    return need


def run(turns: Turns, spec: TurnSpec) -> dict[str, Any]:
    """A text input is rendered by the profile's `turn` format (no BOS: a turn continues its
    session); token ids are taken as they are.  The profile's stops are added."""
    tok, cfg = turns.tokenizer, turns.cfg
    ids = spec.input_ids if spec.input_ids is not None else turn_input(turns.profile, tok, spec.text or "")
    if not ids:
        raise BadInput("the input text encodes to no tokens")
    if not cfg.valid_ids(ids):  # the one token-id check (model/config.py)
        raise BadInput(f"input token ids must be real token ids in [0, {cfg.vocab_size})")
    r = turns.turn(ids, with_stops(turns, decode_params(spec.params)), text=spec.text or "")
    return {"session": r.session, "turn": r.turn, "tokens": r.tokens, "text": tok.decode(r.tokens, skip_special=True),
            "path": r.path, "nfe": r.nfe, "costs": {k: round(v, 6) for k, v in r.costs.items()}, "events": r.events}


def infill(turns: Turns, spec: InfillSpec) -> dict[str, Any]:
    """Every `<hole>` in the text is one masked token: the text around the holes (left and
    right) is the context; the holes are decoded in place and the filled text returned."""
    tok, hole = turns.tokenizer, turns.tokenizer.token_id(HOLE)
    masked = [turns.cfg.mask_id if t == hole else t for t in tok.encode(spec.text)]
    filled, r = fill(turns, masked, decode_params(spec.params), text=spec.text)
    return {"session": r.session, "text": tok.decode(filled, skip_special=True),
            "holes": tok.decode(r.tokens, skip_special=True), "hole_tokens": r.tokens, **summary(r)}
