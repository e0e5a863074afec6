"""Product logic as plain functions, no Celery, no torch: each job kind's workflow takes the
session's turns (workflows/turn.Turns: a job's, or a session in this process) and the kind's
spec, parsed already (runtime/jobs/kinds.SPECS), and returns the job's result (JSON).  Beside
each kind's workflow, its plan: the positions a job of it appends to its session at most, which
the API checks against the model's context before it accepts the job."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.jobs.kinds import ResponseSpec
from workflows import agent, narrative, report, responses, turn
from workflows.turn import DEFAULT, Turns, fits, turn_input

#: a workflow: (the turns, the kind's spec model as runtime/jobs/kinds.SPECS names it) -> result
Workflow = Callable[[Turns, Any], dict[str, Any]]
#: a plan: (the kind's spec model, the model's tokenizer, its profile) -> positions at most
Plan = Callable[[Any, Tokenizer, Profile], int]

#: job kind -> workflow
WORKFLOWS: dict[str, Workflow] = {"turn": turn.run, "infill": turn.infill, "narrative": narrative.run,
                                  "agent": agent.run, "report": report.run,
                                  "response": responses.run}


def _response(spec: ResponseSpec, tok: Tokenizer, profile: Profile = DEFAULT) -> int:
    """A text response's: its input as setflow's own models read it (workflows/responses.py) and
    what it may decode; an imported model's input (maybe a chat template) is not counted (a
    bound below), nor a response with tools (its length depends on what the model writes)."""
    if spec.mode != "text":
        return 0
    n = len(turn_input(profile, tok, spec.text or "")) if profile.facts == "slots" else 0
    return n + spec.params.max_new_tokens


#: job kind -> its plan; a kind not here plans 0 positions: its length depends on what the model
#: writes (an agent's tool results: an agent whose session fills up before its answer fails with
#: code "no_answer")
PLANS: dict[str, Plan] = {"turn": turn.planned, "infill": turn.infill_planned, "narrative": narrative.planned,
                          "report": report.planned, "response": _response}


def positions(kind: str, spec: object, tok: Tokenizer, profile: Profile = DEFAULT) -> int:
    """Positions a job of `kind` appends to its session at most (inputs + tokens it may decode)."""
    plan = PLANS.get(kind)
    return plan(spec, tok, profile) if plan is not None else 0


def check_fits(kind: str, spec: object, tok: Tokenizer, used: int, max_seq_len: int,
               profile: Profile = DEFAULT) -> int:
    """The positions the job needs (positions()); BadInput when it cannot fit: `used` positions
    of the session are taken already."""
    return fits(kind, positions(kind, spec, tok, profile), used, max_seq_len)
