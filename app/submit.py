"""`setflow submit KIND SPEC`: submit a job to the API, follow its events with a progress bar
(sections for a report, tokens otherwise), print its result.  A job that stops at calls its
client runs (an agent's client_tools) asks for each output on the terminal; without one (stdin
not a TTY) it prints the pending calls and exits 3, to be answered by `setflow answer`.

`setflow answer JOB CALL_ID OUTPUT`: send one call's output (the job resumes once every pending
call has one)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from app.client import ApiError, Client
from runtime.errors import CliError
from runtime.settings import Settings


def _spec(arg: str) -> dict[str, Any]:
    text = sys.stdin.read() if arg == "-" else Path(arg).read_text() if not arg.lstrip().startswith("{") else arg
    try:
        spec = json.loads(text)
    except (json.JSONDecodeError, OSError) as e:
        raise CliError(f"the spec is not JSON: {e}") from None
    if not isinstance(spec, dict):
        raise CliError("the spec is a JSON object")
    return spec


WAITING = 3  #: the exit status of `submit` for a job left waiting for its tool outputs


def _client(args: argparse.Namespace) -> Client:
    s = Settings()
    key = args.key or s.api_key
    if not key:
        raise CliError("an API key is needed: --key or SETFLOW_API_KEY")
    return Client(args.url or s.api_url, key)


def answer(args: argparse.Namespace) -> int:
    with _client(args) as c:
        try:
            job = c.tool_outputs(args.job, {args.call_id: args.output})
        except ApiError as e:
            raise CliError(f"{e.code}: {e.message}") from None
    print(f"job {job['id']} {job['status']}", file=sys.stderr)
    return 0


def _ask(c: Client, job_id: str, ask: bool) -> bool:
    """The job waits for tool outputs: each pending call's output read from the terminal and
    sent (True), or, without a terminal, the calls printed (False: the caller exits)."""
    job = c.get_job(job_id)
    if job["status"] != "requires_action":
        return True  # answered already: it runs on
    calls = job["required_action"]["calls"]
    if not ask:
        print(json.dumps(job["required_action"], indent=2))
        print(f"job {job_id} waits for tool outputs; answer each with: setflow answer {job_id} CALL_ID OUTPUT",
              file=sys.stderr)
        return False
    outputs = {}
    for call in calls:
        outputs[call["id"]] = input(f"{call['id']} {call['call']} = ").strip()
    try:
        c.tool_outputs(job_id, outputs)
    except ApiError as e:
        raise CliError(f"{e.code}: {e.message}") from None
    return True


def submit(args: argparse.Namespace) -> int:
    try:
        spec = _spec(args.spec)
    except FileNotFoundError:
        raise CliError(f"no such file: {args.spec}") from None
    ask = sys.stdin.isatty() and args.spec != "-"
    with _client(args) as c:
        try:
            job = c.create_job(args.kind, spec, session=args.session, priority=args.priority)
        except ApiError as e:
            raise CliError(f"{e.code}: {e.message}") from None
        print(f"job {job['id']} queued (session {job['session']})", file=sys.stderr, flush=True)
        if args.no_wait:
            print(json.dumps(job, indent=2))
            return 0
        bar = tqdm(total=None, unit="token", file=sys.stderr, desc=args.kind)
        done: dict[str, Any] = {}
        for ev in c.events(job["id"]):
            if ev["event"] == "step":
                bar.update(len(ev["tokens"]))
            elif ev["event"] == "progress" and ev.get("sections"):
                bar.set_postfix_str(f"section {ev['section']}/{ev['sections']}")
            elif ev["event"] == "status" and ev.get("status") == "requires_action":
                bar.clear()
                if not _ask(c, job["id"], ask):
                    bar.close()
                    return WAITING
            elif ev["event"] == "result":
                done = ev
        bar.close()
    if done.get("status") != "succeeded":
        print(f"job {job['id']} {done.get('status')}: {json.dumps(done.get('error'))}", file=sys.stderr)
        return 1
    r = done["result"]
    print(r.get("markdown") or r.get("text") or json.dumps(r, indent=2))
    return 0
