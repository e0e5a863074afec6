"""TurnResult: what one turn of a session returns, on every path (the engine's, the in-process
runner's).  Plain data, no torch: the workflows and the API read it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TurnResult:
    session: str
    tokens: list[int]  # the tokens this turn generated (input excluded); infill: those of the holes, in position order
    path: str  # "new", "warm", "restore" or "recompute"; "done": a job step's turn written before
    costs: dict[str, float] = field(default_factory=dict)  # seconds per part, and the estimates
    events: list[str] = field(default_factory=list)  # e.g. a failed restore and why
    nfe: int = 0  # forward passes of this turn (its prefill and its final commit included)
    turn: int = -1  # the turn's index in the session (its SQL row)
