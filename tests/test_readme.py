"""The README and the docs/ rooms say what the code does.

- Their ```python blocks run as written: each file's in order, in one namespace (a block that
  opens with `# fragment` needs what only its reader has, a webhook receiver's request: it is
  compiled, not run); ```json blocks parse.
- Every `setflow ...` command they show parses with the CLI's own parser (app/cli.py), and every
  `make X` the README names is a Makefile target.
- docs/operations.md lists every setting with its true default (runtime/settings.py), and a
  default quoted in prose as `name` (value) is the setting's.
BENCHMARKS.md is a dated record, not a manual: it is not checked here."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.cli import parser
from runtime.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MANUAL = [README, *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "BENCHMARKS.md")]
FRAGMENT = "# fragment"

#: what each file's snippets must have shown, from their output and their namespace once they ran
CHECKS: dict[str, Callable[[str, dict[str, Any]], dict[str, bool]]] = {
    "README.md": lambda out, ns: {
        "the narrative and the report printed": "facts checked" in out and "## Revenue" in out,
        "the agent's answer is verified": ns["job"]["result"]["verified"] is True,
        "the response answers in percent": ns["r"].status == "completed" and "%" in ns["r"].output_text},
    "model.md": lambda out, ns: {"the model decoded": "forward passes" in out, "the resumed turn ended": ns["state"].done},
    "sessions.md": lambda out, ns: {"a new session's first turn": ns["r"].path == "new"},
    "workers.md": lambda out, ns: {"the job succeeded": ns["done"].status == "succeeded"},
    "api.md": lambda out, ns: {"the fork's turn succeeded": ns["turn"]["status"] == "succeeded"},
}


def blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(), flags=re.S | re.M)


@pytest.mark.parametrize("path", [p for p in MANUAL if blocks(p, "python")], ids=lambda p: p.name)
def test_python_snippets_run(path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                             tmp_path: Path) -> None:
    monkeypatch.setenv("SETFLOW_DATA_DIR", str(tmp_path))  # the embedded Redis and SQLite file go there
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    namespace: dict[str, Any] = {}
    for code in blocks(path, "python"):
        compiled = compile(code, str(path), "exec")
        if not code.startswith(FRAGMENT):
            exec(compiled, namespace)  # noqa: S102 - our own docs
    failed = [what for what, ok in CHECKS[path.name](capsys.readouterr().out, namespace).items() if not ok]
    assert not failed, f"{path.name}: {failed}"


def test_every_runnable_room_is_checked() -> None:
    runnable = {p.name for p in MANUAL if any(not b.startswith(FRAGMENT) for b in blocks(p, "python"))}
    assert runnable == set(CHECKS), "a file with runnable snippets needs its CHECKS entry (and one without, none)"


def test_json_snippets_parse() -> None:
    import json

    for path in MANUAL:
        for text in blocks(path, "json"):
            json.loads(text)


def _code_lines(text: str) -> list[str]:
    """The lines of code blocks (indented by 4 or fenced), backslash continuations joined."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            lines.append(line.strip())
    return re.sub(r"\\\n\s*", " ", "\n".join(lines)).splitlines()


def commands(text: str) -> tuple[list[list[str]], list[str]]:
    """(the argument lists of every `setflow` command line in code blocks, the first word after
    `setflow` in every inline code span)."""
    full = []
    for line in _code_lines(text):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue  # not a shell line (Python, JSON)
        for i, w in enumerate(words):
            if w == "setflow" or w.endswith("/setflow"):
                full.append(words[i + 1:])
                break
    inline = re.findall(r"`(?:\.venv/bin/)?setflow ([a-z]+)", text)
    return full, inline


def subcommands() -> set[str]:
    actions = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(actions[0].choices)


@pytest.mark.parametrize("path", MANUAL, ids=lambda p: p.name)
def test_setflow_commands_parse(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full, inline = commands(path.read_text())
    for args in full:
        try:
            parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"{path.name}: `setflow {shlex.join(args)}` does not parse: {capsys.readouterr().err}")
    unknown = set(inline) - subcommands()
    assert not unknown, f"{path.name} names setflow commands that do not exist: {sorted(unknown)}"
    if path == README:
        assert full, "the README shows setflow commands"


def test_readme_make_targets_exist() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    named = set(re.findall(r"^make ([a-z][\w-]*)", "\n".join(_code_lines(README.read_text())), flags=re.M))
    assert {"demo", "test"} <= named and named <= targets


def _env(name: str) -> str:
    alias = Settings.model_fields[name].validation_alias
    return alias if isinstance(alias, str) else f"SETFLOW_{name.upper()}"


def _shown(value: object) -> str:
    """A default as docs/operations.md's table writes it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dict) and not value:
        return "{}"
    return str(value)


def test_operations_lists_every_setting_with_its_default() -> None:
    table = dict(re.findall(r"^\| `([A-Z_]+)` \| `([^`]*)` \|", (ROOT / "docs/operations.md").read_text(), flags=re.M))
    want = {_env(n): _shown(f.get_default(call_default_factory=True)) for n, f in Settings.model_fields.items()}
    missing = sorted(set(want) - set(table))
    assert not missing, f"docs/operations.md's settings table lacks {missing}: add each with its default"
    assert not set(table) - set(want), f"docs/operations.md lists settings that do not exist: {sorted(set(table) - set(want))}"
    wrong = {k: (table[k], want[k]) for k in want if table[k] != want[k]}
    assert not wrong, f"docs/operations.md: (written, true) defaults differ: {wrong}"


UNITS = {"": 1, "MiB": 2**20, "GiB": 2**30, "s": 1, "ms": 1, "h": 3600, "days": 86400}


def test_defaults_quoted_in_prose_are_the_settings() -> None:
    fields = Settings.model_fields
    for path in MANUAL:
        for name, number, unit in re.findall(r"`([a-z_]+)` \((\d[\d ]*)(?: (MiB|GiB|s|ms|h|days))?[,) ]",
                                             path.read_text()):
            if name in fields:
                default = fields[name].get_default(call_default_factory=True)
                assert int(number.replace(" ", "")) * UNITS[unit] == default, \
                    f"{path.name}: `{name}` ({number} {unit}) but its default is {default}"


def test_relative_links_point_at_files() -> None:
    for path in MANUAL:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (path.parent / target).exists(), f"{path.name} links to {target}, which does not exist"


def test_named_files_exist() -> None:
    """A file the manual names by its path (`runtime/settings.py`) is there: a move updates the docs."""
    for path in MANUAL:
        for name in re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|json|yml|sh|html|png))`", path.read_text()):
            assert (ROOT / name).exists(), f"{path.name} names {name}, which does not exist"
