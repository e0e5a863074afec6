"""The webhook sender's HTTP client (runtime/webhooks/sender.py sends with it): what a receiver may
cost one delivery, and where a tenant's URL may lead.

- A delivery ends by its deadline, whatever the receiver does: `bounded(deadline_s)` around a
  request gives it one wall-clock budget, connect to the last byte read, that every socket
  operation's timeout is cut to (httpx's timeouts are per read: a receiver answering
  `102 Processing` every second held a request 25 s against a 10 s timeout, as httpcore reads
  past interim answers).
- The answer's head is capped: at most MAX_INTERIM interim (1xx) answers and MAX_HEAD_BYTES read
  before the final answer's headers end; past either the attempt fails (a RemoteProtocolError),
  and is retried as any failure.
- Public addresses only, unless allow_private: the host is resolved here, within the deadline,
  every address it resolves to is checked, and the connection goes to an address checked (a
  name rebound between a check and the connect reaches nothing).  An IPv6 address that embeds an
  IPv4 one (mapped, compatible, NAT64, 6to4, Teredo) is judged by the IPv4 address.
- No proxy, whatever the environment (trust_env off: HTTP(S)_PROXY or ALL_PROXY in a worker's
  environment would send every delivery through a host nobody checked, to the URL's host
  unchecked).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

USER_AGENT = "setflow-webhooks/0.1"
MAX_INTERIM = 5  # interim (1xx) answers a delivery reads, at most, before its final one
MAX_HEAD_BYTES = 8 * 1024  # read before the final answer's headers end (1xx included), at most (h11: 16 KiB a block)
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052's well-known prefix: the IPv4 address is the last 32 bits
#: RFC 8215's local-use NAT64 prefix: where the IPv4 address sits depends on the prefix length an
#: operator chose (RFC 6052, /48 to /96), so no one reading tells it: never public
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # ::a.b.c.d (deprecated, still routed by some stacks)
_local = threading.local()


class Budget:
    """One delivery's budget: its wall-clock deadline (monotonic) and what it has read of the
    answer's head so far."""

    def __init__(self, deadline_s: float) -> None:
        self.deadline = time.monotonic() + deadline_s
        self.deadline_s = deadline_s
        self.head_bytes = 0
        self.status_lines = 0
        self._tail = b"\n"  # the last bytes read (a status line starts a line: the first one too)

    def timeout(self, timeout: float | None, exc: type[Exception] = httpcore.ReadTimeout) -> float:
        """`timeout` cut to the time left; `exc` once none is left."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise exc(f"the delivery's deadline ({self.deadline_s:g} s, webhook_timeout_s) passed")
        return left if timeout is None else min(timeout, left)

    @contextmanager
    def named(self, exc: type[Exception] = httpcore.ReadTimeout) -> Iterator[None]:
        """A timeout inside the block that came at the deadline says so."""
        try:
            yield
        except httpcore.TimeoutException:
            if time.monotonic() < self.deadline:
                raise
            raise exc(f"the delivery's deadline ({self.deadline_s:g} s, webhook_timeout_s) passed") from None

    def more(self, max_bytes: int) -> int:
        """How much the next read of the head may take: what is left of MAX_HEAD_BYTES (a read
        never takes a body's bytes past it); RemoteProtocolError where nothing is, or where more
        than MAX_INTERIM interim answers have come (the head is still being read: the final
        answer's headers have not ended)."""
        if self.status_lines > MAX_INTERIM + 1:  # at least MAX_INTERIM + 1 interims ended, and more to read
            raise httpcore.RemoteProtocolError(f"more than {MAX_INTERIM} interim (1xx) answers")
        if self.head_bytes >= MAX_HEAD_BYTES:
            raise httpcore.RemoteProtocolError(f"an answer's head past {MAX_HEAD_BYTES} bytes")
        return min(max_bytes, MAX_HEAD_BYTES - self.head_bytes)

    def took(self, data: bytes) -> None:
        """Count what a read gave.  Only the head is read (the sender never reads a body; the
        bytes of one that came with the head's last read are never read past), so every line
        starting "HTTP/1." is a status line: a header's name has no "/"."""
        self.head_bytes += len(data)
        seen = self._tail + data
        self.status_lines += seen.count(b"\nHTTP/1.")
        self._tail = seen[-7:]  # shorter than a match: none is counted twice


@contextmanager
def bounded(deadline_s: float) -> Iterator[Budget]:
    """The requests this thread makes inside the block share one Budget of `deadline_s`."""
    _local.budget = budget = Budget(deadline_s)
    try:
        yield budget
    finally:
        _local.budget = None


def _budget() -> Budget | None:
    return getattr(_local, "budget", None)


class BoundedStream(httpcore.NetworkStream):
    """A connection whose every operation waits no longer than its delivery's deadline allows,
    and whose reads count against its head's caps.  Outside `bounded`, only httpx's own
    timeouts apply."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        budget = _budget()
        if budget is None:
            return self._inner.read(max_bytes, timeout)
        with budget.named():
            data = self._inner.read(budget.more(max_bytes), budget.timeout(timeout))
        budget.took(data)
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        budget = _budget()
        if budget is None:
            self._inner.write(buffer, timeout)
            return
        with budget.named(httpcore.WriteTimeout):
            self._inner.write(buffer, budget.timeout(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        budget = _budget()
        if budget is None:
            return BoundedStream(self._inner.start_tls(ssl_context, server_hostname, timeout))
        with budget.named(httpcore.ConnectTimeout):  # the handshake waits no longer than the deadline
            timeout = budget.timeout(timeout, httpcore.ConnectTimeout)
            return BoundedStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class Guarded(httpcore.SyncBackend):
    """httpcore's network backend for webhooks: the host resolved here within the deadline, every
    address it gives checked (public ones only, unless allow_private: one that is not refuses
    them all), the connection made to those addresses, in order, until one answers (the
    address checked is the address connected to: no second lookup), and the stream bounded
    (BoundedStream).  TLS still names the URL's host (httpcore takes it from the request, not
    from here)."""

    def __init__(self, allow_private: bool = False) -> None:
        self.allow_private = allow_private

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        budget = _budget()
        if budget is not None:
            timeout = budget.timeout(timeout, httpcore.ConnectTimeout)
        addresses = list(dict.fromkeys(str(a[4][0]) for a in _resolve(host, port, timeout)))
        private = [] if self.allow_private else [a for a in addresses if not public(a)]
        if private or not addresses:
            raise httpcore.ConnectError(f"{host} resolves to {', '.join(private) or 'nothing'}: not a public address "
                                        "(webhook_allow_private allows it)")
        for i, address in enumerate(addresses):  # as socket.create_connection does: the next one where one refuses
            try:
                if budget is None:
                    return BoundedStream(super().connect_tcp(address, port, timeout, local_address, socket_options))
                with budget.named(httpcore.ConnectTimeout):
                    left = budget.timeout(timeout, httpcore.ConnectTimeout)
                    return BoundedStream(super().connect_tcp(address, port, left, local_address, socket_options))
            except httpcore.ConnectError:
                if i == len(addresses) - 1:
                    raise
        raise AssertionError("unreachable: the last address's error is raised")


def _resolve(host: str, port: int, timeout: float | None) -> list[Any]:
    """getaddrinfo within `timeout` (it has no timeout of its own): on a thread of its own, so
    that a name whose DNS answers slowly holds up no other lookup; one given up on ends when
    the system's resolver gives up."""
    got: list[Any] = []

    def look() -> None:
        try:
            got.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as e:
            got.append(e)

    thread = threading.Thread(target=look, name="setflow-webhook-dns", daemon=True)
    thread.start()
    thread.join(timeout)
    if not got:
        raise httpcore.ConnectTimeout(f"{host}: no address within {timeout:g} s")
    if isinstance(got[0], OSError):
        raise httpcore.ConnectError(f"{host}: {got[0]}") from got[0]
    return list(got[0])


def embedded(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address] | None:
    """The IPv4 addresses an IPv6 address carries, where it carries some: IPv4-mapped
    (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d), 6to4 (2002:AABB:CCDD::,
    bits 16-48), Teredo (2001::/32: its server and its client); None where it carries none."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    if ip in NAT64 or ip in IPV4_COMPATIBLE:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    return None


def public(host: str, named: bool = False) -> bool:
    """Whether `host`, an IP address, is a public (globally routable, not multicast) one; an IPv6
    address that embeds an IPv4 one is as public as each address it embeds (a NAT64 gateway, a
    6to4 or Teredo relay delivers to that one); a name (not an address) counts as public where
    `named`."""
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        try:  # the short and numeric forms a resolver reads as an IPv4 address: 127.1, 2130706433, 0x7f000001
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return named
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in NAT64_LOCAL:
            return False
        inner = embedded(ip)
        if inner is not None:
            return all(public(str(v4)) for v4 in inner)
    return bool(ip.is_global) and not ip.is_multicast


def client(timeout_s: float, allow_private: bool = False) -> httpx.Client:
    """The sender's HTTP client: no redirects followed (a 3xx is an answer, not a hop to an
    address nobody checked), no proxy from the environment (trust_env off), its connections
    made by Guarded.  A request is bounded by its deadline only inside `bounded`."""
    http = httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False, headers={"user-agent": USER_AGENT})
    # httpx builds its httpcore pool itself and takes no network backend: this one is put in its
    # place (tests/runtime/jobs/test_webhooks.py shows it refusing a private address)
    http._transport._pool._network_backend = Guarded(allow_private)  # type: ignore[attr-defined]
    return http
