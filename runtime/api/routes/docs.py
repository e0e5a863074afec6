"""/docs: Swagger UI over /openapi.json, its scripts and styles served from this process (the
bundle the fastapi-offline package keeps: Swagger UI 5, which reads OpenAPI 3.1), not from a
CDN: a script another origin serves would run with this origin's rights, where the page keeps
its API key.  ReDoc is off: one viewer is enough."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import fastapi_offline
from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

router = APIRouter(include_in_schema=False)
ASSETS = "/docs/assets"  # where `assets` is mounted (app.py)
assets = StaticFiles(directory=Path(fastapi_offline.__file__).parent / "static")


def inline_scripts(html: str) -> str:
    """CSP source expressions ('sha256-...') allowing exactly the page's inline scripts (Swagger
    UI's start-up script)."""
    return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()}'"
                    for code in re.findall(r"<script>(.*?)</script>", html, flags=re.S))


@router.get("/docs", response_class=HTMLResponse)
def docs() -> HTMLResponse:
    page = get_swagger_ui_html(openapi_url="/openapi.json", title="setflow API",
                               swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                               swagger_css_url=f"{ASSETS}/swagger-ui.css",
                               swagger_favicon_url=f"{ASSETS}/favicon.png")
    html = bytes(page.body).decode()
    csp = (f"default-src 'none'; script-src 'self' {inline_scripts(html)}; style-src 'self' 'unsafe-inline'; "
           "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return HTMLResponse(html, headers={"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff"})
