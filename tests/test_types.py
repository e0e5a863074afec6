"""The type gate: mypy with the project's configuration (pyproject.toml [tool.mypy]): strict for
runtime/, workers/, workflows/; public signatures for model/."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_passes() -> None:
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
