"""Reports in one session: later sections with and without document boundaries.

    python bench/documents.py [--quick] [--sessions N]

Each session writes a report's sections as turns of one session in this process, with the
report workflow's own step (workflows/report.section: each section's input starts with [BOS] and
ends with its heading), greedy, with the report setting (prefix, W = 8, tau = 0.99).  Side by
side in one run, on the same held-out payloads: the model as shipped (a [BOS] starts a document:
no attention across it, model/masks.py within_documents) and the same decode with that rule
switched off (every section reads all the earlier ones).  Reported:
the fraction of sections fully correct (verified by the workflow's own check on their first
decode: domain/narrative.py read_back, every slot, direction and comparison), for the first
section of a session and for the later ones.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import model.decode as decode_mod  # noqa: E402
from domain import report  # noqa: E402
from domain.draws import make_payload
from domain.payload import Payload
from model import shipped  # noqa: E402
from model.params import DecodeParams  # noqa: E402
from runtime.sessions.local import LocalTurns  # noqa: E402
from workflows.report import section, section_payload  # noqa: E402

PARAMS = DecodeParams(policy="prefix", window=8, tau=0.99, max_new_tokens=200)
SEED = 90_000  # held out: training draws its payloads from other seeds


@contextmanager
def documents(on: bool) -> Iterator[None]:
    saved = decode_mod.within_documents
    if not on:
        decode_mod.within_documents = lambda mask, *_: mask  # type: ignore[assignment]
    try:
        yield
    finally:
        decode_mod.within_documents = saved


def session(m: Any, tok: Any, p: Payload) -> list[bool]:
    """One report session: a section per metric (up to 3), as the report job writes them;
    whether each is fully correct."""
    turns = LocalTurns(m, tok)
    out = []
    for metric in p.metrics[:3]:
        sec = report.Section(report.TITLES[metric.key][0], section_payload(p, [metric.key]))
        # its input ends with the heading; judged on its first decode (a greedy AR retry of a
        # section that failed its check is not what this bench compares)
        done, _, _ = section(turns, sec.title, sec.payload, PARAMS, allow_unverified=True)
        out.append(done["attempt"] == "first" and done["verified"])
    return out


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 sessions")
    ap.add_argument("--sessions", type=int, default=30, help="report sessions of 3 sections (default 30)")
    args = ap.parse_args(argv)
    n = 6 if args.quick else args.sessions
    if n < 1:
        ap.error("--sessions must be >= 1")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    m, tok = shipped.load()
    rng, payloads = random.Random(SEED), []
    while len(payloads) < n:
        p = make_payload(rng)
        if len(p.metrics) >= 3:
            payloads.append(p)
    result: dict[str, Any] = {"bench": "documents", "sessions": n}
    for name, on in (("documents", True), ("no_documents", False)):
        with torch.no_grad(), documents(on):
            runs = [session(m, tok, p) for p in payloads]
        first = [r[0] for r in runs]
        later = [x for r in runs for x in r[1:]]
        result[name] = {"first_correct": round(sum(first) / len(first), 3),
                        "later_correct": round(sum(later) / len(later), 3), "later_n": len(later)}
        print(f"{name:>13}: first sections {sum(first)}/{len(first)} fully correct, "
              f"later sections {sum(later)}/{len(later)}", file=sys.stderr)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
