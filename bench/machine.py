"""What a benchmark reads of the machine it runs on: the Redis to use (REDIS_URL, the local
server, else the embedded one), Redis's used memory, a process group's resident memory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from runtime.embedded import connect
from runtime.settings import Settings

LOCAL = "redis://127.0.0.1:6379/0"


def find_redis(tmp: Path) -> tuple[str, Any]:
    """REDIS_URL, else the local server on 6379 when it answers, else the embedded one (returned
    too, to be stopped)."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url, None
    try:
        probe = redis.Redis.from_url(LOCAL, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        try:
            if probe.ping():
                return LOCAL, None
        finally:
            probe.close()
    except redis.RedisError:
        pass
    client, server = connect(Settings(data_dir=tmp))
    client.close()
    return (server.url if server else ""), server


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def group_rss_mb(pgid: int) -> float:
    """Resident memory of a process group (a worker: its main process and its pool process)."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            for line in (d / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return round(total / 1024, 1)
