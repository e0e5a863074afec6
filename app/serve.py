"""`setflow serve`: the API under uvicorn.  With no REDIS_URL the embedded Redis is started (or
joined) first, as `setflow worker` does, so `setflow serve` and `setflow worker` on one machine
share it.  `ApiServer` runs the same app on a thread (the demo and the tests).  Both hand the app
its sender over Celery (the API itself imports no worker code)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from celery import Celery
from fastapi import FastAPI

from runtime.api.app import create_app
from runtime.api.openai.websocket import WS_MAX_QUEUE, frame_ceiling
from runtime.embedded import EmbeddedRedis
from runtime.settings import Settings
from workers.celery_app import make_app, sender


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def api_app(settings: Settings) -> tuple[FastAPI, Celery]:
    """The API with its sender over Celery, and that Celery app (closed by the caller at the end)."""
    celery = make_app(settings)
    return create_app(settings, send=sender(celery)), celery


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class ApiServer:
    """The API on a background thread: start() returns once it accepts connections."""

    def __init__(self, settings: Settings, host: str | None = None, port: int | None = None) -> None:
        self.host = host or settings.api_host
        port = settings.api_port if port is None else port
        self.port = port or free_port(self.host)
        self.app, self.celery = api_app(settings)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning",
                                                   lifespan="on", timeout_graceful_shutdown=2,
                                                   ws_max_size=frame_ceiling(settings), ws_max_queue=WS_MAX_QUEUE))
        self.thread = threading.Thread(target=self.server.run, name="setflow-api", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 20.0) -> ApiServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not start on {self.url}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.celery.close()


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (how docker and systemd stop a process) unwinds like Ctrl-C: a KeyboardInterrupt,
    so every `finally` runs and stops what the process started; by default SIGTERM ends the
    process on the spot.  (uvicorn takes both signals while it serves, and raises the one it got
    again once it has shut down: then this handler turns it into the interrupt.)"""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def serve(host: str | None, port: int | None) -> int:
    s = Settings()
    server = None
    if not s.redis_url:
        server = EmbeddedRedis(s.data_dir / "redis")
        s = s.model_copy(update={"redis_url": server.start()})
    if not s.api_keys:
        print("setflow serve: no API keys configured (SETFLOW_API_KEYS='{\"KEY\": \"TENANT\"}'): "
              "every request but /healthz and the page is refused", flush=True)
    host = host or s.api_host
    port = s.api_port if port is None else port
    if port == 0:
        port = free_port(host)
    celery = None
    try:
        app, celery = api_app(s)
        print(f"setflow API on http://{host}:{port} (docs: /docs)", flush=True)
        # open event streams end within 5 s of SIGTERM/SIGINT (clients resume with Last-Event-ID)
        with sigterm_as_ctrl_c():
            uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5,
                        ws_max_size=frame_ceiling(s), ws_max_queue=WS_MAX_QUEUE)
    except KeyboardInterrupt:  # the signal that stopped uvicorn, raised again: the expected end
        pass
    finally:
        if celery is not None:
            celery.close()
        if server is not None and server.owned:
            server.stop()
    return 0
