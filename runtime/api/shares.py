"""Fair shares of an API process among the tenants that use it: a tenant that keeps its turns
(gate.Turns) busier than the others while they are active waits before each of its requests,
so that it takes at most its share of the process.

    use(T)    the seconds T's requests held their turns (turn taken -> response started), each
              decayed by exp(-age / window); rate(T) = use(T) / window: the turns it kept busy,
              on average, lately (an upload of 10k rows: about 0.1 s; a submission: 0.02 s)
    active    the tenants with a request in the last window: n of them
    cap(T)    max(LEAD x the others' mean rate, BUSY / n)
    held      n > 1 and rate(T) > cap(T): the workers' rule (runtime/jobs/fairness.py held_at),
              with a share of 1 / n of the process

A held tenant's request, whatever it is, waits at the door (gate.Paced: no turn, no thread;
past gate.WAITING_PER_TURN x inflight waiting, refused 429) until its use has decayed to its
cap: window x ln(rate / cap) seconds, at most MAX_WAIT_S; only a cancel of the work it was
answered for goes at once (charged all the same: gate.Paced's credits).  So it runs at about
`cap` turns, however fast it asks; the others' requests never wait for it.

Why a cap, not a share of what is idle: the API process shares the machine with Redis, the
database and often the workers, and a tenant's requests take their cores from the others' jobs
too, not only from their requests (bench/abuse.py; docs/BENCHMARKS.md, "Abuse soak").
The floor BUSY / n keeps a tenant whose requests are few and short (a burst while the others
idle) from being held at all, and a tenant alone is never held: where nobody else asks, the
cap costs nothing.  Per process: each API process keeps its own shares (a tenant spread over
k processes gets up to k caps).  In memory, no I/O: one dict entry per tenant of the key map.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

from runtime.jobs.fairness import decayed, held_at

MAX_WAIT_S = 2.0  #: one request waits at most this long (a client's timeout is often 5 s)


class ApiShares:
    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """window_s: the decay's time constant and how long a tenant stays active after its
        last request (runtime/settings.py tenant_fair_window_s: 0 turns the shares off)."""
        self.window = window_s
        self.clock = clock
        self.use: dict[str, tuple[float, float]] = {}  # tenant -> (use, when), decayed from then
        self.total = (0.0, 0.0)  # the active tenants' use together, the same way
        self.active: OrderedDict[str, float] = OrderedDict()  # tenant -> its last request, oldest first

    def _decayed(self, entry: tuple[float, float], now: float) -> float:
        return decayed(*entry, now, self.window)

    def _arrive(self, tenant: str, now: float) -> None:
        """The tenant is active now; those without a request in the window leave (their use
        out of the total)."""
        self.active[tenant] = now
        self.active.move_to_end(tenant)
        total = self._decayed(self.total, now)
        while self.active:
            oldest, seen = next(iter(self.active.items()))
            if seen >= now - self.window:
                break
            del self.active[oldest]
            total -= self._decayed(self.use.pop(oldest, (0.0, now)), now)
        self.total = (max(0.0, total), now)

    def wait_s(self, tenant: str) -> float:
        """How long the tenant's request waits before it runs (0: at once); it is active now."""
        if self.window <= 0:
            return 0.0
        now = self.clock()
        self._arrive(tenant, now)
        n = len(self.active)
        mine = self._decayed(self.use.get(tenant, (0.0, now)), now)
        cap = held_at(mine, self._decayed(self.total, now), n, 1 / n, self.window)  # in use: a rate times the window
        if cap is None:
            return 0.0
        return min(MAX_WAIT_S, self.window * math.log(mine / cap))

    def charge(self, tenant: str, seconds: float) -> None:
        """The tenant's request held its turn this long (it gave it back now)."""
        if self.window <= 0 or seconds <= 0:
            return
        now = self.clock()
        if tenant not in self.active:  # left while its request ran (a long one): active again
            self._arrive(tenant, now)
        self.use[tenant] = (self._decayed(self.use.get(tenant, (0.0, now)), now) + seconds, now)
        self.total = (self._decayed(self.total, now) + seconds, now)
