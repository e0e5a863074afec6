"""The README's Python snippets run as written (in order, sharing one namespace)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_snippets_run(capsys, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SETFLOW_DATA_DIR", str(tmp_path))  # the embedded Redis and SQLite file go there
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    namespace: dict[str, object] = {}
    for code in blocks:
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - our own README
    assert "forward passes" in capsys.readouterr().out
    assert namespace["state"].done  # type: ignore[attr-defined]
