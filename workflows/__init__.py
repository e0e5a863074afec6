"""Product logic as plain functions, no Celery, no torch: each job kind's workflow takes the
session's turns (workflows/turn.Turns: a job's, or a session in this process) and the kind's
spec, parsed already (runtime/jobs/specs.SPECS), and returns the job's result (JSON)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workflows import agent, narrative, report, responses, turn
from workflows.turn import Turns

#: a workflow: (the turns, the kind's spec model as runtime/jobs/specs.SPECS names it) -> result
Workflow = Callable[[Turns, Any], dict[str, Any]]

#: job kind -> workflow
WORKFLOWS: dict[str, Workflow] = {"turn": turn.run, "infill": turn.infill, "narrative": narrative.run,
                                  "agent": agent.run, "report": report.run,
                                  "response": responses.run}
