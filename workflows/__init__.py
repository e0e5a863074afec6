"""Product logic as plain functions, no Celery: each job kind's workflow takes a JobContext and
the job's spec and returns the job's result (JSON).  runtime/schemas.SPECS holds each kind's
spec model (the API checks a submission against it, the worker again)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.jobs.context import JobContext
from workflows import agent, narrative, report, turn

Workflow = Callable[[JobContext, dict[str, Any]], dict[str, Any]]

#: job kind -> workflow (runtime/schemas.SPECS holds each kind's spec model)
WORKFLOWS: dict[str, Workflow] = {"turn": turn.run, "infill": turn.infill, "narrative": narrative.job,
                                  "agent": agent.job, "report": report.job}
