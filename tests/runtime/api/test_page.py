"""The web page in a real browser (headless Chromium) against a real stack: the API on a thread
and a worker process (app/demo.py Stack) on the test Redis.  A narrative job started from the
page: its step events place tokens at their positions on the canvas (several per step: set
decoding), the result arrives over SSE, the jobs table shows it succeeded; then a report job.
Its export beside the result: the chart as SVG (a report's: one per section), the PDF downloaded
from the page.  The sessions view: a job's session in the list, its transcript (each turn's
resume path and costs) and K/V cache; a follow-up turn, a fork at turn 0, the fork deleted.  A pending tool call:
the agent with `metric` run on the client stops at each metric call; the page shows it and sends
the output.
Screenshots: .cache/screenshots/web-page.png, web-page-report.png and web-page-sessions.png (and the
tests' tmp dirs); docs/web-page.png (the sessions view) and docs/web-page-report.png (a report
with its charts) with SETFLOW_UPDATE_SCREENSHOT=1."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from app.demo import Stack
from domain.tools import Dataset
from runtime.settings import Settings
from tests.runtime.api.conftest import delete_keys
from workflows import tools

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
    job_id: str = (page.text_content("#notice") or "").rsplit(" ", 1)[-1]
    page.wait_for_selector(f"#status[data-job='{job_id}'][data-status=succeeded]", timeout=TIMEOUT_MS)
    return job_id


@contextmanager
def _browser(stack: Stack) -> Iterator[tuple[Any, list[str]]]:
    """The page in headless Chromium, with the key given in the fragment; the errors it met
    (console errors, page errors, failed requests, HTTP 4xx/5xx answers) are collected."""
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
            yield page, errors
        finally:
            browser.close()


def _screenshot(page: Any, tmp_path: Path, name: str, docs: bool | str = False) -> None:
    """Kept in the test's tmp dir and under .cache/ (ignored by git); docs/web-page.png (or the
    docs file `docs` names) is refreshed on request: SETFLOW_UPDATE_SCREENSHOT=1 make test."""
    page.wait_for_timeout(2000)  # the new-token highlight fades (0.6 s, then a 1.2 s transition)
    shot = page.screenshot(full_page=True)
    (tmp_path / name).write_bytes(shot)
    out = ROOT / ".cache" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(shot)
    if docs and os.environ.get("SETFLOW_UPDATE_SCREENSHOT") == "1":
        (ROOT / "docs" / (docs if isinstance(docs, str) else "web-page.png")).write_bytes(shot)


def _get(stack: Stack, path: str) -> tuple[int, Any]:
    """GET on the API from the test (not the page): its status and JSON body."""
    req = urllib.request.Request(stack.api.url + path, headers={"Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _notice_error(page: Any) -> str | None:
    """The API's error the page shows in its notice area, if it shows one."""
    return page.text_content("#notice") if page.locator("#notice.error").count() else None


def test_page_runs_a_narrative_and_a_report(stack: Stack, tmp_path: Path) -> None:
    with _browser(stack) as (page, errors):
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
        # its export beside the text: the chart as SVG, drawn by the API (a frame where no script runs)
        page.wait_for_selector(f"#report[data-job='{job_id}']:not([hidden])", timeout=10_000)
        frame = page.frame_locator("#report-frame")
        frame.locator("svg").first.wait_for(timeout=10_000)
        assert "Revenue (k USD)" in (frame.locator("svg").first.text_content() or "")
        _screenshot(page, tmp_path, "web-page.png")

        # 2) a report: its markdown ends with the key figures; a chart per section in its export
        _run(page, "#run-report")
        final = page.text_content("#final") or ""
        assert "Key figures" in final, final
        page.wait_for_selector("#report:not([hidden])", timeout=10_000)
        page.wait_for_function("document.getElementById('report-frame').contentDocument.querySelectorAll('svg').length === 3",
                               timeout=10_000)
        with page.expect_download() as download:  # a download as the page saves it: the PDF, fetched with the key
            page.click("#report button[data-fmt=pdf]")
        saved = download.value.suggested_filename
        assert saved.startswith("quarterly-review-") and saved.endswith(".pdf"), saved
        _screenshot(page, tmp_path, "web-page-report.png", docs="web-page-report.png")
        print(f"narrative: {n} tokens in {steps} steps; screenshots in {tmp_path}")
    assert not errors, errors


PATHS = ("new", "warm", "restore", "recompute")


def test_page_sessions_view_follow_up_fork_delete(stack: Stack, tmp_path: Path) -> None:
    """A narrative's session from the list: its transcript (turns with their resume path and
    costs), its K/V cache; a follow-up turn decoded live and added to the transcript; a fork at
    turn 0 (a new session of one turn); the fork deleted (gone from the list and the API)."""
    with _browser(stack) as (page, errors):
        job_id = _run(page, "#run-narrative")
        sid = page.get_attribute(f"#status[data-job='{job_id}']", "data-session") or ""
        assert sid, "the result names no session"

        # 1) the list holds the job's session; opening it shows its transcript and K/V cache
        page.click(f"#sessions tr[data-session='{sid}']", timeout=10_000)  # the list polls every 1.5 s
        page.wait_for_selector(f"#session-view[data-session='{sid}']", timeout=10_000)
        n0 = int(page.get_attribute("#session-view", "data-turns") or 0)
        assert n0 >= 1, "no turns in the narrative's session"
        first = page.locator("#transcript [data-turn='0']")
        assert first.get_attribute("data-path") == "new", first.inner_text()  # a new session's first turn
        assert first.locator(".path").text_content() == "new"
        assert first.locator("a.job").get_attribute("title") == job_id
        timings = page.locator("#transcript .turn-card .timing").all_text_contents()
        assert any("decode" in t and "ms" in t for t in timings), timings  # the narrative's result has its costs
        kv = page.text_content("#kv") or ""
        assert "K/V in Redis" in kv and "last worker" in kv, kv

        # 2) a follow-up turn: a turn job, followed live, then a new turn in the transcript
        page.fill("#follow-up", "How did churn change?")
        page.fill("#follow-up-tokens", "12")
        page.click("#send-turn")
        page.wait_for_selector("#notice:has-text('queued turn job')", timeout=10_000)
        turn_job = (page.text_content("#notice") or "").rsplit(" ", 1)[-1]
        page.wait_for_selector(f"#status[data-job='{turn_job}'][data-status=succeeded]", timeout=TIMEOUT_MS)
        new = page.locator(f"#transcript [data-turn='{n0}']")
        new.wait_for(timeout=10_000)  # the open session is read again when its job ends
        assert new.get_attribute("data-path") in PATHS[1:], new.inner_text()  # resumed, not new
        assert new.locator("a.job").get_attribute("title") == turn_job
        assert "How did churn change?" in (new.locator(".txt.in").text_content() or "")
        assert page.get_attribute("#session-view", "data-turns") == str(n0 + 1)
        _screenshot(page, tmp_path, "web-page-sessions.png", docs=True)

        # 3) fork at turn 0: a new session of one turn, opened, in the list
        page.click("#fork-0")
        page.wait_for_selector("#notice:has-text('forked session')", timeout=10_000)
        fork = (page.text_content("#notice") or "").rsplit(" ", 1)[-1]
        assert fork != sid
        page.wait_for_selector(f"#session-view[data-session='{fork}']", timeout=10_000)
        assert page.get_attribute("#session-view", "data-turns") == "1"
        assert page.locator("#transcript [data-turn]").count() == 1
        page.wait_for_selector(f"#sessions tr[data-session='{fork}']", timeout=10_000)

        # 4) delete the fork: gone from the list and from the API; the parent stays
        page.click("#delete-session")
        page.wait_for_selector(f"#notice:has-text('deleted session {fork}')", timeout=10_000)
        page.wait_for_selector(f"#sessions tr[data-session='{fork}']", state="detached", timeout=10_000)
        assert page.is_hidden("#session-view")
        assert page.locator(f"#sessions tr[data-session='{sid}']").count() == 1
        assert _get(stack, f"/v1/sessions/{fork}")[0] == 404
        status, body = _get(stack, f"/v1/sessions/{sid}")
        assert status == 200 and len(body["turns"]) == n0 + 1, body
        assert _notice_error(page) is None, page.text_content("#notice")
    assert not errors, errors


def test_page_answers_a_pending_tool_call(stack: Stack, tmp_path: Path) -> None:
    """The agent with `metric` run on the client: the job stops at each metric call
    (requires_action); the page shows the call (tool, arguments, deadline) and sends the output
    typed in (here the number the server's own tool would return, so that the answer checks);
    the job resumes and succeeds."""
    with _browser(stack) as (page, errors):
        page.check("#client-metric")
        page.click("#run-agent")
        page.wait_for_selector("#notice:has-text('queued agent job'), #notice.error", timeout=10_000)
        assert _notice_error(page) is None, page.text_content("#notice")  # the spec refused: no backend yet
        job_id = (page.text_content("#notice") or "").rsplit(" ", 1)[-1]
        done = f"#status[data-job='{job_id}'][data-status]:not([data-status=''])"
        waiting = f"#pending[data-job='{job_id}']:not([hidden]) [data-call]"
        data = Dataset(2026)  # the agent spec's default dataset_seed
        answered: list[tuple[str, str]] = []
        for _ in range(10):  # max_calls (6) waits at most
            page.wait_for_selector(f"{waiting}, {done}", timeout=TIMEOUT_MS)
            if page.locator(done).count():
                break
            call = page.locator(waiting).first
            call_id = call.get_attribute("data-call") or ""
            assert call.get_attribute("data-tool") == "metric"
            assert "answer by" in (call.locator("[data-deadline]").text_content() or "")
            text = call.locator("code").text_content() or ""
            if not answered:  # the page while the job waits (the test's tmp dir and .cache/)
                shot = page.screenshot(full_page=True)
                (tmp_path / "web-page-pending.png").write_bytes(shot)
                (ROOT / ".cache" / "screenshots").mkdir(parents=True, exist_ok=True)
                (ROOT / ".cache" / "screenshots" / "web-page-pending.png").write_bytes(shot)
            if not answered:  # a malformed output: the API's 422 is shown, the call still waits
                call.locator(f"[data-output='{call_id}']").fill("lots")
                call.locator(f"[data-send='{call_id}']").click()
                page.wait_for_selector("#notice.error", timeout=10_000)
                assert "bad_input" in (page.text_content("#notice") or ""), page.text_content("#notice")
                assert (call.locator(f"[data-error='{call_id}']").text_content() or "").startswith("bad_input")
                assert page.locator(f"#pending [data-call='{call_id}']").count() == 1
            output = tools.run_call(text, data).result
            call.locator(f"[data-output='{call_id}']").fill(output)
            call.locator(f"[data-send='{call_id}']").click()
            # the POST's answer, not the job's status event (which may come first and take the call
            # off the page while the notice still shows the malformed output's refusal)
            page.wait_for_selector(f"#notice:has-text('sent the output of {call_id} to job'), #notice.error",
                                   timeout=10_000)
            assert _notice_error(page) is None, (text, output, page.text_content("#notice"))
            page.wait_for_selector(f"#pending [data-call='{call_id}']", state="detached", timeout=10_000)
            answered.append((text, output))
        page.wait_for_selector(done, timeout=TIMEOUT_MS)
        assert answered, "the job never waited for a client tool output"
        assert page.get_attribute("#status", "data-status") == "succeeded", page.text_content("#final")
        assert page.is_hidden("#pending")
        status, job = _get(stack, f"/v1/jobs/{job_id}")
        assert status == 200 and job["status"] == "succeeded", job
        assert [c["result"] for c in job["result"]["calls"] if c["tool"] == "metric"] == [o for _, o in answered]
        page.screenshot(path=str(tmp_path / "web-page-tool-call.png"), full_page=True)
        print(f"answered {answered}")
    refused = [e for e in errors if "/tool_outputs" in e or "status of 422" in e]  # the malformed output's
    assert len(refused) >= 1 and not set(errors) - set(refused), errors


def test_a_links_key_replaces_the_stored_one_only_when_the_user_says_so(stack: Stack) -> None:
    """A `#key=` link from someone else must not switch, unseen, the tenant the page acts for:
    the page asks, and keeps the stored key unless told otherwise; the fragment is dropped."""
    other = "key-from-a-link-01"
    with _browser(stack) as (page, _):  # opened with #key=KEY: stored (nothing was)
        asked: list[str] = []

        def answer(accept: bool) -> None:
            page.once("dialog", lambda d: (asked.append(d.message), d.accept() if accept else d.dismiss()))

        def open_link(key: str) -> None:  # a load of its own, as a link opened anew is (not a same-page #)
            page.goto("about:blank")
            page.goto(f"{stack.api.url}/#key={key}")

        answer(False)
        open_link(other)
        assert page.input_value("#key") == KEY and len(asked) == 1 and "other than the one" in asked[0]
        assert page.evaluate("location.hash") == ""
        open_link(KEY)  # the same key again: nothing to ask
        assert len(asked) == 1
        answer(True)
        open_link(other)
        assert page.input_value("#key") == other and len(asked) == 2
        assert page.evaluate("localStorage.getItem('setflow-key')") == other


def test_the_page_and_docs_run_under_their_csp_from_this_origin_only(stack: Stack) -> None:
    """The page's own inline script runs under its Content-Security-Policy (an injected one
    would not); /docs (Swagger UI) loads its scripts from the API, not a CDN."""
    with _browser(stack) as (page, errors):
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url))
        # the page's first lists land before the test leaves it: a fetch cut off by the test's
        # own navigation is not an error of the page's
        page.wait_for_load_state("networkidle")
        page.goto(f"{stack.api.url}/docs")
        try:
            page.wait_for_selector(".swagger-ui .info .title:has-text('setflow')", timeout=30_000)
        except Exception as e:
            raise AssertionError(errors) from e
        page.wait_for_selector(".opblock-tag", timeout=30_000)  # the routes, read from /openapi.json
        assert requested and all(u.startswith(stack.api.url) or u.startswith("data:") for u in requested), requested
        page.goto(stack.api.url)
        assert page.evaluate("typeof headers") == "function"  # the inline script ran under the CSP
        blocked = page.evaluate("""() => { const s = document.createElement("script");
            s.textContent = "window.injected = 1"; document.body.append(s); return window.injected === undefined; }""")
        assert blocked, "a script injected into the page ran"
        csp = [e for e in errors if "Content Security Policy" in e and "injected" not in e]
        assert len(csp) <= 1 and not [e for e in errors if "Content Security Policy" not in e], errors
