"""The README's Python snippets run as written (in order, sharing one namespace)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_snippets_run(capsys) -> None:  # type: ignore[no-untyped-def]
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    namespace: dict[str, object] = {}
    for code in blocks:
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - our own README
    assert "forward passes" in capsys.readouterr().out
    assert namespace["state"].done  # type: ignore[attr-defined]
