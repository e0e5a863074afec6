"""The web page in a real browser (headless Chromium) against a real stack: the API on a thread
and a worker process (app/demo.py Stack) on the test Redis.  A narrative job started from the
page: its step events place tokens at their positions on the canvas (several per step: set
decoding), the result arrives over SSE, the jobs table shows it succeeded; then a report job.
Screenshot: .cache/screenshots/web-page.png (and the test's tmp dir); docs/web-page.png with
SETFLOW_UPDATE_SCREENSHOT=1."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.demo import Stack
from runtime.settings import Settings
from tests.runtime.api.conftest import delete_keys

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
KEY = "key-page-0001"
ROOT = Path(__file__).resolve().parents[3]
TIMEOUT_MS = 90_000

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prefix = f"sfpage-{uuid.uuid4().hex[:10]}"
    s = Settings(redis_url=redis_url, key_prefix=prefix, data_dir=tmp_path_factory.mktemp("page"),
                 api_keys={KEY: "acme"}, api_port=0)
    st = Stack(s, workers=1, port=0)  # its workers get its settings, the prefix too (worker_env)
    try:
        st.start()
        yield st
    finally:
        st.stop()
        delete_keys(redis_url, f"{prefix}*")


def _run(page: Any, button: str) -> str:
    """Click a run button, wait for the job's result on the page; the job's id."""
    kind = button.removeprefix("#run-")
    page.click(button)
    page.wait_for_selector(f"#notice:has-text('queued {kind} job')", timeout=10_000)
    job_id = page.text_content("#notice").rsplit(" ", 1)[-1]
    page.wait_for_selector(f"#status[data-job='{job_id}'][data-status=succeeded]", timeout=TIMEOUT_MS)
    return job_id


def test_page_runs_a_narrative_and_a_report(stack: Stack, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (the page test drives a real browser)")
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            page.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
            page.goto(f"{stack.api.url}/#key={KEY}")
            assert page.input_value("#key") == KEY

            # 1) a narrative: tokens placed at their positions, a set per step, the text at the end
            job_id = _run(page, "#run-narrative")
            final = page.text_content("#final") or ""
            assert final.strip(), "no result text"
            assert "Northwind" in final or "1240" in final, final
            toks = page.locator("#canvas span.tok")
            n = toks.count()
            assert n > 10, f"only {n} tokens on the canvas"
            positions = [int(x) for x in toks.evaluate_all("els => els.map(e => e.dataset.pos)")]
            assert len(set(positions)) == n, "a position holds two tokens"
            steps = int(page.get_attribute("#canvas", "data-steps") or 0)
            assert 0 < steps < n, f"{steps} step events for {n} tokens: no step committed a set"
            row = page.locator(f"#jobs tr.job[data-id='{job_id}']")
            row.locator("td.succeeded").wait_for(timeout=10_000)  # the table polls every 1.5 s
            assert row.locator("td").nth(1).text_content() == "narrative"
            assert row.locator(".bar > div").get_attribute("style") == "width:100%"
            page.wait_for_timeout(2000)  # the new-token highlight fades (0.6 s, then a 1.2 s transition)
            shot = page.screenshot(full_page=True)
            (tmp_path / "web-page.png").write_bytes(shot)
            # every run keeps its screenshot under .cache/ (ignored by git); the one in docs/ is
            # refreshed on request: SETFLOW_UPDATE_SCREENSHOT=1 make test
            out = ROOT / ".cache" / "screenshots"
            out.mkdir(parents=True, exist_ok=True)
            (out / "web-page.png").write_bytes(shot)
            if os.environ.get("SETFLOW_UPDATE_SCREENSHOT") == "1":
                (ROOT / "docs" / "web-page.png").write_bytes(shot)

            # 2) a report: its markdown ends with the key figures
            _run(page, "#run-report")
            final = page.text_content("#final") or ""
            assert "Key figures" in final, final
            page.screenshot(path=str(tmp_path / "web-page-report.png"), full_page=True)
            print(f"narrative: {n} tokens in {steps} steps; screenshots in {tmp_path}")
        finally:
            browser.close()
    assert not errors, errors
