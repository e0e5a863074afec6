"""The modules a reader opens to follow one request end to end (issue 50's targets).

    python bench/modules.py [--root DIR] [--list]

A request's modules are the transitive closure of project imports from its two ends: the route
module that answers it (runtime/api/routes/...) and workers/runner.py, which runs its job on a
worker.  Imports are read as tests/test_layers.py reads them: every import statement, a lazy one
inside a function too, a project module resolved to the module itself (`from a import b` is
`a.b` when that is a module), a package's __init__ counted as one module.  One rule narrows it:
the job kinds' registry (workflows/__init__.py) leads only to the request's own workflow module,
not to the other kinds', as a reader follows one kind.

Two counts per request: `modules`, every project module reached (app, workers, workflows,
runtime, model, domain); and `runtime`, those outside model/ and domain/ (the network and the
product's rules, each read on its own), which is how the issue counted.  Ends with one JSON
line."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_layers import FLOORS, floor, imports, modules  # noqa: E402

#: request -> (its route module, its workflow module)
REQUESTS = {"POST /v1/responses": ("runtime.api.openai.routes", "workflows.responses"),
            "POST /v1/jobs narrative": ("runtime.api.routes.jobs", "workflows.narrative")}
WORKER = "workers.runner"  # runs every job on a worker
REGISTRY = "workflows"  # the job kinds' registry: followed to the request's own kind only


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    mods = modules(root)
    return {m: imports(f.read_text(), m, set(mods)) & set(mods) for m, f in mods.items()}


def reached(g: dict[str, set[str]], roots: list[str], kind: str) -> set[str]:
    """The closure of `roots` under g, where REGISTRY leads to no workflow module but `kind`
    (the others are reached only where `kind` or another module imports them)."""
    seen: set[str] = set()
    todo = [r for r in roots if r in g]
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        todo.extend(w for w in g[v] if not (v == REGISTRY and w.startswith(REGISTRY + ".") and w != kind))
    return seen


def count(g: dict[str, set[str]]) -> dict[str, dict[str, object]]:
    """Per request: its modules, those outside model/ and domain/, how many on each floor, and
    their names."""
    out: dict[str, dict[str, object]] = {}
    for request, (route, kind) in REQUESTS.items():
        mods = reached(g, [route, WORKER], kind)
        floors = Counter(f if f in FLOORS else "leaves" for f in map(floor, mods))
        out[request] = {"modules": len(mods), "runtime": sum(1 for m in mods if floor(m) not in ("model", "domain")),
                        "floors": dict(sorted(floors.items())), "list": sorted(mods)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="a checkout to count (default: this one)")
    ap.add_argument("--list", action="store_true", help="print each request's modules")
    a = ap.parse_args()
    got = count(graph(a.root))
    for request, c in got.items():
        print(f"{request}: {c['modules']} modules, {c['runtime']} outside model/ and domain/")
        if a.list:
            print("    " + "\n    ".join(c["list"]))
    print(json.dumps({r: {k: v for k, v in c.items() if k != "list"} for r, c in got.items()}))


if __name__ == "__main__":
    main()
