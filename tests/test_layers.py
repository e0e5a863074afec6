"""The tree is the architecture: imports run one way only,

    app -> workers -> runtime/api -> workflows -> runtime/schedules -> runtime/jobs -> runtime/webhooks
        -> runtime/sessions -> model -> domain

plus the shared leaves (runtime/settings, errors, keys, db, tables, embedded, migrations), which
import only each other and domain/.  domain/ imports nothing of the project but itself.  A
module may import its own floor and any floor below it, never one above; no import cycle
anywhere; workflows/, the API, the schedules and domain/ never import torch, not even through another module.
Every import counts, also one inside a function: a lazy import is still a dependency.  The
checks are plain functions, so the test also shows that each one fails on a bad tree."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "workers", "workflows", "runtime", "model", "domain")
#: floor -> rank; a module may import a floor of the same or a lower rank
FLOORS = {"domain": -1, "model": 0, "runtime.sessions": 1, "runtime.webhooks": 2, "runtime.jobs": 3, "runtime.schedules": 4,
          "workflows": 5, "runtime.api": 6, "workers": 7, "app": 8}
LEAVES = ("runtime.settings", "runtime.errors", "runtime.keys", "runtime.db", "runtime.tables", "runtime.embedded",
          "runtime.migrations", "runtime")  # `runtime` itself: the package's __init__
NO_TORCH = ("workflows", "runtime.api", "runtime.schedules", "domain")  # floors that must not reach torch through any import


def modules(root: Path = ROOT) -> dict[str, Path]:
    """module name -> file, for every module of the project's packages."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def imports(source: str, name: str, known: set[str]) -> set[str]:
    """Every module `source` imports, anywhere in it: project modules resolved to the module
    itself (`from a.b import c` is `a.b.c` when that is a module), others by their top name."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name if a.name in known else a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                pkg = name.split(".")[: len(name.split(".")) - node.level]
                base = ".".join(pkg + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in known else base if base in known else base.split(".")[0])
    return out


def floor(module: str) -> str | None:
    """The floor a module stands on (the longest floor or leaf that prefixes it)."""
    best = None
    for f in (*FLOORS, *LEAVES):
        if (module == f or module.startswith(f + ".")) and (best is None or len(f) > len(best)):
            best = f
    return best


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import that runs against the order, as 'a -> b (why)'."""
    bad = []
    for a, deps in sorted(graph.items()):
        fa = floor(a)
        for b in sorted(deps):
            if b not in graph:
                continue  # a third-party module
            fb = floor(b)
            if fa == "domain":
                ok = fb == "domain"  # the domain imports nothing else of the project
            elif fb == "domain":
                ok = True  # every floor and leaf may read the domain
            elif fa in LEAVES:
                ok = fb in LEAVES
            elif fb in LEAVES:
                ok = fa != "model"  # the model imports nothing else of the project
            else:
                ok = fa is not None and fb is not None and FLOORS[fb] <= FLOORS[fa]
            if not ok:
                bad.append(f"{a} -> {b} ({fa} may not import {fb})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def reaches_torch(graph: dict[str, set[str]], roots: tuple[str, ...]) -> list[str]:
    """Each module under `roots` from which some chain of imports reaches torch: 'a -> ... -> torch'."""
    bad = []
    for start in sorted(m for m in graph if floor(m) in roots):
        seen, todo = {start: [start]}, [start]
        while todo:
            v = todo.pop()
            for w in sorted(graph.get(v, ())):
                if w == "torch":
                    bad.append(" -> ".join([*seen[v], "torch"]))
                    todo.clear()
                    break
                if w in graph and w not in seen:
                    seen[w] = [*seen[v], w]
                    todo.append(w)
    return bad


def project_graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(f.read_text(), m, set(mods)) for m, f in mods.items()}


# ---- the tree -------------------------------------------------------------------------------


def test_every_module_stands_on_a_floor() -> None:
    assert [m for m in modules() if floor(m) is None] == []


def test_no_import_runs_against_the_order() -> None:
    assert upward(project_graph()) == []


def test_no_import_cycle() -> None:
    assert cycles(project_graph()) == []


def test_workflows_and_the_api_never_reach_torch() -> None:
    assert reaches_torch(project_graph(), NO_TORCH) == []


# ---- the checks fail on a bad tree ------------------------------------------------------------


def test_the_checks_catch_an_upward_import_a_cycle_and_torch() -> None:
    g = {"runtime.sessions.engine": {"runtime.jobs.rows", "torch"}, "runtime.jobs.rows": {"runtime.sessions.engine"},
         "model.decode": {"runtime.errors"}, "runtime.errors": {"runtime.settings"}, "runtime.settings": set(),
         "workflows.agent": {"runtime.jobs.rows"}, "runtime.db": {"runtime.jobs.rows"}}
    assert upward(g) == ["model.decode -> runtime.errors (model may not import runtime.errors)",
                         "runtime.db -> runtime.jobs.rows (runtime.db may not import runtime.jobs)",
                         "runtime.sessions.engine -> runtime.jobs.rows (runtime.sessions may not import runtime.jobs)"]
    assert cycles(g) == [["runtime.jobs.rows", "runtime.sessions.engine"]]
    assert reaches_torch(g, NO_TORCH) == ["workflows.agent -> runtime.jobs.rows -> runtime.sessions.engine -> torch"]


def test_imports_resolve_submodules_relative_and_lazy_imports() -> None:
    known = {"runtime.api.routes.jobs", "runtime.api.routes", "app.cli", "app.submit", "app"}
    src = "from runtime.api.routes import jobs\nfrom . import cli\ndef f():\n    import torch.nn\n"
    assert imports(src, "app.submit", known) == {"runtime.api.routes.jobs", "app.cli", "torch"}
