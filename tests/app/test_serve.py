"""`setflow serve` on a fresh machine: the embedded Redis and a SQLite file under the data
folder, the API on a free port (--port 0); healthy with no worker yet; Ctrl-C stops it and the
Redis it started."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from runtime.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])  # Ctrl-C; docker stop and systemd
def test_serve_starts_the_embedded_redis_serves_and_stops_cleanly(tmp_path: Path, stop: signal.Signals) -> None:
    data = tmp_path / "d"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SETFLOW_") and k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(SETFLOW_DATA_DIR=str(data), SETFLOW_API_KEYS=json.dumps({"key-serve-0001": "acme"}),
               PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", "0"], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        m = re.search(r"setflow API on (http://127\.0\.0\.1:\d+)", line)
        assert m, line
        url, deadline = m[1], time.monotonic() + 30
        while True:
            try:
                r = httpx.get(f"{url}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the API did not come up"
                time.sleep(0.1)
        assert r.status_code == 200 and r.json() == {"status": "ok", "redis": True, "database": True, "workers": []}
        s = httpx.post(f"{url}/v1/sessions", headers={"X-API-Key": "key-serve-0001"}, timeout=5)
        assert s.status_code == 201
        assert httpx.post(f"{url}/v1/sessions", timeout=5).status_code == 401
        assert (data / "setflow.db").exists() and EmbeddedRedis(data / "redis").alive()
    finally:
        p.send_signal(stop)
        p.wait(30)
        assert p.stdout is not None
        p.stdout.close()
    assert p.returncode == 0
    assert not EmbeddedRedis(data / "redis").alive()


@pytest.mark.slow
def test_the_demo_stopped_by_sigterm_stops_all_it_started(tmp_path: Path) -> None:
    """`setflow demo --serve` under docker or systemd: SIGTERM stops its worker processes, the
    API and the embedded Redis, as Ctrl-C does (here sent while the demo's report runs)."""
    data = tmp_path / "d"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SETFLOW_") and k not in ("REDIS_URL", "DATABASE_URL", "BROKER_URL")}
    env.update(SETFLOW_DATA_DIR=str(data), PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "app.cli", "demo", "--port", "0", "--serve"], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert p.stdout is not None
        lines: list[str] = []
        while not any(" up in " in x for x in lines):  # the stack is up: Redis, the API, a worker
            lines.append(p.stdout.readline())
            assert lines[-1] or p.poll() is None, "".join(lines)
        started = descendants(p.pid)
        assert started and EmbeddedRedis(data / "redis").alive()
        p.send_signal(signal.SIGTERM)
        p.wait(60)
        out = "".join(lines) + p.stdout.read()
    finally:
        if p.poll() is None:
            p.kill()
        assert p.stdout is not None
        p.stdout.close()
    assert p.returncode == 130 and "setflow demo: stopped (worker, API, Redis)." in out, out
    assert not EmbeddedRedis(data / "redis").alive()
    assert not [pid for pid in started if alive(pid)]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc: each task's children)."""
    out, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            kids = [int(x) for x in (task / "children").read_text().split()]
            out += kids
            todo += kids
    return out


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
