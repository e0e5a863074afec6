"""A real webhook receiver for tests: an HTTP server on a free loopback port, in a thread, that
keeps every request (headers and body) and answers each with the next status of a script (200
once the script runs out)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes


@dataclass
class Receiver:
    url: str
    statuses: list[int] = field(default_factory=list)  # the answers to come, in order
    got: list[Received] = field(default_factory=list)


@contextmanager
def receiver(*statuses: int) -> Iterator[Receiver]:
    """A receiver answering `statuses` in turn, then 200; stopped at the end of the block."""
    rec = Receiver(url="", statuses=list(statuses))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            with lock:
                rec.got.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                status = rec.statuses.pop(0) if rec.statuses else 200
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    thread = threading.Thread(target=server.serve_forever, name="test-receiver", daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def closed_port_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()
    return f"http://127.0.0.1:{port}/hooks"
