"""The web page: a live view of the tenant's jobs with their progress, and of a job's decoding,
where each committed set's tokens appear at their positions (the set-diffusion order made
visible).  One static file; it talks to the API with the key typed in (or given as #key=...,
a fragment: never sent to the server, never in its logs)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)
PAGE = Path(__file__).resolve().parents[1] / "static" / "index.html"


@router.get("/", response_class=HTMLResponse)
def index() -> HTMLResponse:
    return HTMLResponse(PAGE.read_text(encoding="utf-8"))
