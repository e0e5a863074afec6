"""The order in which a worker takes messages from its queues (kombu's Redis transport asks this
object for the BRPOP key order before every fetch, and tells it which queue it got a message from).

A worker's own queue (turns of sessions it holds warm) and the shared interactive queue (new
sessions, sessions whose worker died) take turns: a strict order would starve one of them under
load (measured: with own-queue-first, new sessions' first turns waited 30 s behind the warm
sessions' next turns).  The batch queue comes after both, always: batch jobs only use idle time.
"""

from __future__ import annotations

from kombu.utils.scheduling import round_robin_cycle

BATCH_SUFFIX = ".batch"


class InteractiveFirst(round_robin_cycle):
    def consume(self, n: int) -> list[str]:
        items = list(self.items[:n])
        return [q for q in items if not q.endswith(BATCH_SUFFIX)] + [q for q in items if q.endswith(BATCH_SUFFIX)]

    def rotate(self, last_used: str) -> str:
        # the name may come back with the broker's global key prefix in front
        for q in self.items:
            if last_used == q or last_used.endswith(q):
                self.items.append(self.items.pop(self.items.index(q)))
                break
        return last_used
