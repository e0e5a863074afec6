"""`setflow demo` (`make demo`) on the embedded default: a bundled Redis and a SQLite file in a
temporary folder, the API and a worker process; a report with progress, a two-question agent
session with its resume paths, the web page's address; everything stopped at the end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.cli import main
from runtime.embedded import EmbeddedRedis

pytestmark = pytest.mark.slow


def test_the_demo_runs_the_product_end_to_end_and_stops_cleanly(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = tmp_path / "d"  # short: the embedded Redis' socket path must fit in 100 characters
    monkeypatch.setenv("SETFLOW_DATA_DIR", str(data))
    for name in ("REDIS_URL", "DATABASE_URL", "BROKER_URL", "SETFLOW_API_KEYS"):
        monkeypatch.delenv(name, raising=False)
    assert main(["demo", "--port", "0"]) == 0
    out = capsys.readouterr().out
    assert f"Redis unix://{data.resolve()}/redis/redis.sock" in out and "sqlite:///" in out
    assert "4/4" in out  # the progress bar reached the last section
    for title in ("# Northwind quarterly review", "## Revenue", "## Customer health", "## Key figures"):
        assert title in out
    facts = re.search(r"facts read back from the sections: (\d+)/(\d+); key figures filled exactly: (\w+)", out)
    assert facts and facts[1] == facts[2] and facts[3] == "True"
    q1, q2 = out.split("(worker demo-0 stopped, demo-1 started")  # between the two questions
    paths1, paths2 = re.findall(r"turn \d+: (\w+) +load", q1), re.findall(r"turn \d+: (\w+) +load", q2)
    assert paths1[0] == "new" and set(paths1[1:]) == {"warm"}  # its worker keeps it warm between tool calls
    assert paths2[0] in ("restore", "recompute") and set(paths2[1:]) <= {"warm"}  # a new worker: from Redis or SQL
    # the second question waited for the client's metric, holding no worker, across the replacement
    assert "status requires_action, no worker holds it" in q1 and "the client answers {'call_1': '2.7'}" in q2
    assert 'tool metric("churn", "APAC", "2026-Q3") -> 2.7 (client)' in q2
    # one company: the agent reads the report's own figures (EMEA revenue 468 -> 512)
    assert 'metric("revenue", "EMEA", "2026-Q3") -> 512' in q1 and 'metric("revenue", "EMEA", "2026-Q2") -> 468' in q1
    assert "9.4" in q1.split("   A: ")[1].splitlines()[0]
    assert re.search(r"turn \d+: warm +decoded before the wait", q2)
    assert len({q for q in re.findall(r"   Q: (.*)", out)}) == 2 and out.count("   A: ") == 2
    assert re.search(r"web page .*: http://127\.0\.0\.1:\d+/#key=setflow-demo-key", out)
    assert out.rstrip().endswith("setflow demo: stopped (worker, API, Redis).")
    assert "demo-1" in out
    assert not EmbeddedRedis(data / "redis").alive()  # the bundled Redis is stopped too
