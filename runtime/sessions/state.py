"""What a committed manifest's state holds, as JSON beside the K/V segments (no torch): the decode
state, the last turn's parameters, the slots' (position, token) ledger in commit order, and how
many turns it holds.  Written by a turn's save and by a fork; read by a restore."""

from __future__ import annotations

from typing import Any

from model.params import DecodeParams, DecodeState
from runtime.errors import CorruptState


def params_json(p: DecodeParams) -> dict[str, Any]:
    """A turn's parameters as its SQL row and the manifest keep them: every field a request can
    give (DecodeParams.to_dict: the guide, a Python object, is not)."""
    return p.to_dict()


def turn_state(decode: DecodeState, params: dict[str, Any], positions: list[int], tokens: list[int],
               turns: int) -> dict[str, Any]:
    """The state of a manifest whose segments hold `turns` turns: slot i holds (positions[i], tokens[i])."""
    return {"decode": decode.to_json(), "params": params, "ledger": [positions, tokens], "turns": turns}


def read_state(state: dict[str, Any]) -> tuple[DecodeState, list[int], list[int]]:
    """-> (decode state, positions, tokens) of a committed manifest; CorruptState when unreadable."""
    try:
        led = state["ledger"]
        return DecodeState.from_json(state["decode"]), list(led[0]), list(led[1])
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise CorruptState(f"manifest state unreadable: {e!r}") from e


def replayed(ledger: list[tuple[int, int]], rng: str | None) -> DecodeState:
    """The decode state of a session whose turns committed `ledger` (commit order): its token at
    every position, nothing pending, the last turn's RNG.  What a recompute rebuilds and a fork
    stores."""
    seq = [0] * (max(p for p, _ in ledger) + 1 if ledger else 0)
    for p, t in ledger:
        seq[p] = t
    return DecodeState(tokens=seq, rng=rng)
