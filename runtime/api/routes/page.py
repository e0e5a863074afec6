"""The web page: a live view of the tenant's jobs with their progress, and of a job's decoding,
where each committed set's tokens appear at their positions (the set-diffusion order made
visible).  Static files (static/: index.html, page.css, page.js, sessions.js); it talks to the
API with the key typed in (or given as #key=..., a fragment: never sent to the server, never in
its logs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

router = APIRouter(include_in_schema=False)
STATIC = Path(__file__).resolve().parents[1] / "static"
PAGE = STATIC / "index.html"
#: the page's own files beside it: its markup, styles and scripts (no inline script)
ASSETS = {"page.css": "text/css", "page.js": "text/javascript", "sessions.js": "text/javascript"}


#: the page's Content-Security-Policy: its own scripts from this origin and nothing else runs (an
#: injected <script> or handler does not); it talks only to this origin; nobody frames it. Styles
#: may be inline: the page's style attributes and the exports' (their charts' SVG) are.
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
          "connect-src 'self'; frame-src 'self' blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


@router.get("/", response_class=HTMLResponse)
def index() -> HTMLResponse:
    return HTMLResponse(PAGE.read_text(encoding="utf-8"), headers=HEADERS)


def _asset(name: str) -> Callable[[], Response]:
    def serve() -> Response:
        return Response((STATIC / name).read_bytes(), media_type=ASSETS[name], headers=HEADERS)
    return serve


for _name in ASSETS:  # one route each: a catch-all /{name} would shadow /docs, /healthz, /metrics
    router.add_api_route(f"/{_name}", _asset(_name), methods=["GET"], response_class=Response)
