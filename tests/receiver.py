"""A real webhook receiver for tests: an HTTP server on a free loopback port, in a thread, that
keeps every request (headers and body) and answers each with the next status of a script (200
once the script runs out); and a raw one (raw_receiver) that writes whatever bytes it is given,
as slowly as it is told."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Iterator
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


@dataclass
class RawReceiver:
    url: str
    connections: int = 0  # connections accepted


@contextmanager
def raw_receiver(chunks: Callable[[], Iterable[bytes]], every_s: float = 0.0) -> Iterator[RawReceiver]:
    """A receiver that is not an HTTP server: on each connection it reads the request, then
    writes `chunks()` one at a time, `every_s` apart, as they are (a slow or misbehaving
    receiver: `102 Processing` over and over, headers a line at a time); it stops writing when
    the client goes away or the block ends, and closes once the client has."""
    rec = RawReceiver(url="")
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    rec.url = f"http://127.0.0.1:{listener.getsockname()[1]}/hooks"

    def answer(conn: socket.socket) -> None:
        with conn:
            try:
                _read_request(conn)
                for chunk in chunks():
                    conn.sendall(chunk)
                    if stop.wait(every_s):
                        return
                conn.settimeout(5.0)
                while conn.recv(65536):  # until the client closes: closing first could reset what it has not read
                    pass
            except OSError:
                return  # the client gave up

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            rec.connections += 1
            threading.Thread(target=answer, args=(conn,), name="test-raw-answer", daemon=True).start()

    thread = threading.Thread(target=serve, name="test-raw-receiver", daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        stop.set()
        thread.join()
        listener.close()


def _read_request(conn: socket.socket) -> None:
    """Read one request: its head, then content-length bytes of body."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        more = conn.recv(65536)
        if not more:
            return
        body += more
