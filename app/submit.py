"""`setflow submit KIND SPEC`: submit a job to the API, follow its events with a progress bar
(sections for a report, tokens otherwise), print its result."""

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


def submit(args: argparse.Namespace) -> int:
    s = Settings()
    key = args.key or s.api_key
    if not key:
        raise CliError("an API key is needed: --key or SETFLOW_API_KEY")
    try:
        spec = _spec(args.spec)
    except FileNotFoundError:
        raise CliError(f"no such file: {args.spec}") from None
    with Client(args.url or s.api_url, key) as c:
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
            elif ev["event"] == "result":
                done = ev
        bar.close()
    if done.get("status") != "succeeded":
        print(f"job {job['id']} {done.get('status')}: {json.dumps(done.get('error'))}", file=sys.stderr)
        return 1
    r = done["result"]
    print(r.get("markdown") or r.get("text") or json.dumps(r, indent=2))
    return 0
