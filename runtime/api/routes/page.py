"""The web page: a live view of the tenant's jobs with their progress, and of a job's decoding,
where each committed set's tokens appear at their positions (the set-diffusion order made
visible).  One static file; it talks to the API with the key typed in (or given as #key=...,
a fragment: never sent to the server, never in its logs)."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)
PAGE = Path(__file__).resolve().parents[1] / "static" / "index.html"


def inline_scripts(html: str) -> str:
    """CSP source expressions ('sha256-...') allowing exactly the page's own inline scripts."""
    return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()}'"
                    for code in re.findall(r"<script>(.*?)</script>", html, flags=re.S))


def policy(html: str) -> str:
    """The page's Content-Security-Policy: its own inline script and nothing else runs (an
    injected <script> or handler does not); it talks only to this origin; nobody frames it.
    Styles may be inline: the page's and the exports' (their charts' SVG) are."""
    return ("default-src 'none'; "
            f"script-src {inline_scripts(html)}; style-src 'unsafe-inline'; img-src 'self' data: blob:; "
            "connect-src 'self'; frame-src 'self' blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def secured(html: str) -> HTMLResponse:
    return HTMLResponse(html, headers={"Content-Security-Policy": policy(html), "X-Content-Type-Options": "nosniff",
                                       "Referrer-Policy": "no-referrer"})


@router.get("/", response_class=HTMLResponse)
def index() -> HTMLResponse:
    return secured(PAGE.read_text(encoding="utf-8"))
