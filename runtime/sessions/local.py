"""LocalTurns: one session's turns over a bare model in this process, held in memory (no Redis, no
SQL, no lease) — the in-process runner behind benchmarks and the tour.  The decoding is the
engine's own (TurnDecode), so the same turns give the same tokens."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from domain.facts import Slots
from model.config import ModelConfig
from model.kv_cache import KVCache
from model.params import DecodeParams, DecodeState
from model.profiles import Profile
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import BadInput, NotFound
from runtime.sessions.decoding import TurnDecode, infill_holes
from runtime.sessions.once import once
from runtime.sessions.turn import TurnResult


class LocalTurns:
    session = "local"  #: the name its TurnResults carry

    def __init__(self, model: SetDLM, tokenizer: Tokenizer, profile: Profile | None = None,
                 tool_outputs: dict[str, str] | None = None, datasets: dict[str, list[list[str]]] | None = None) -> None:
        """profile: the model's (model/profiles.load, beside its weights); None: its default.
        tool_outputs: call id -> output, for the tools a workflow's client runs (an agent's
        client_tools): the answers a job's client would send, given up front; also where `once`
        keeps its records (a job's, to replay them).  datasets: name
        -> rows, what a tenant's datasets would hold."""
        self.model = model
        self.tokenizer = tokenizer
        self.cfg: ModelConfig = model.cfg
        self.profile = profile if profile is not None else Profile.for_model(model.cfg, tokenizer)
        w = next(model.parameters())
        self.cache = KVCache.for_model(model.cfg, dtype=w.dtype, device=w.device)
        self.state: DecodeState | None = None
        self.turns = 0
        self.progress: dict[str, Any] = {}
        self.checks: Counter[tuple[str, str]] = Counter()  # (part, outcome) -> n
        self.tool_outputs = dict(tool_outputs or {})
        self.datasets = dict(datasets or {})

    def turn(self, ids: list[int], params: DecodeParams, *, text: str = "", infill: bool = False,
             facts: Slots | None = None) -> TurnResult:
        """One turn, as Engine.turn decodes it: `ids` appended and decoded after (infill: ids holds
        mask_id at holes, decoded in place).  text is not kept (the engine keeps it in SQL).
        BadInput for an empty input or a bad infill input, DecodeError past the model's context;
        either leaves the session as it was."""
        if not ids:
            raise BadInput("input must be at least 1 token")
        if infill:
            infill_holes(self.cfg, ids)
        t = time.perf_counter()
        turn = TurnDecode(self.model, self.cache, self.state, ids, params, infill)
        for _ in turn.steps():
            pass
        self.state = turn.state
        result = TurnResult(self.session, turn.tokens, "new" if self.turns == 0 else "warm",
                            {"decode_s": time.perf_counter() - t}, nfe=turn.nfe, turn=self.turns)
        self.turns += 1
        return result

    def used(self) -> int:
        """Positions the session holds: its next turn starts here."""
        return len(self.state.tokens) if self.state is not None else 0

    def tool_output(self, call_id: str) -> str | None:
        return self.tool_outputs.get(call_id)

    def once(self, key: str, fn: Callable[[], Any]) -> Any:
        """Recorded in tool_outputs beside the client's outputs, as a job's row holds them: a
        LocalTurns given a finished one's tool_outputs replays its records."""
        return once(key, fn, self.tool_outputs, self.tool_outputs.__setitem__)

    def dataset(self, name: str) -> list[list[str]]:
        if name not in self.datasets:
            raise NotFound(f"no dataset {name!r}")
        return self.datasets[name]

    def report(self, **progress: Any) -> None:
        """Workflow progress: kept (the last value of each key), shown to nobody."""
        self.progress.update(progress)

    def checked(self, part: str, outcome: str) -> None:
        """A checked part's outcome (workflows/checked.py): counted here, as the job's go to /metrics."""
        self.checks[part, outcome] += 1
