"""One ticker process for the race tests (tests/runtime/schedules/test_schedules.py):

    python -m tests.runtime.schedules.ticking '<json>'

json: {"settings": {...Settings}, "base", "start", "speed", "stop", "die_at", "split", "name"}.
Its clock is a fast one that every process of a test shares: base + (time.time() - start) *
speed.  It runs the ticker's passes until the Redis key `stop` exists (the test sets it once
the ticks it counts are submitted), its jobs submitted to a Dispatcher whose send does nothing
(no worker).  die_at > 0: once it has written die_at jobs (a pass writes a tenant's jobs as one
batch, a tick's together; one at a time where a batch is refused), right after they were
written and before their ticks are recorded, it kills itself with SIGKILL (a kill -9 mid-tick).
split: it leads whatever the lock says (a split brain).
Prints what its passes did, as one JSON line."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from typing import Any

import redis

from runtime.db import make_engine
from runtime.jobs.dispatch import Dispatcher
from runtime.jobs.rows import Jobs
from runtime.schedules.ticker import Ticker
from runtime.settings import Settings

PASS_S = 0.02  # real seconds between passes


def main(args: dict[str, Any]) -> None:
    s = Settings(**args["settings"])
    r = redis.Redis.from_url(str(s.redis_url))
    dispatcher = Dispatcher(r, Jobs(make_engine(s), s), lambda *_: None)
    written = 0
    submit, submit_batch = dispatcher.submit, dispatcher.submit_batch

    def count(n: int) -> None:
        nonlocal written
        written += n
        if args["die_at"] and written >= args["die_at"]:
            os.kill(os.getpid(), signal.SIGKILL)

    def dying(*a: Any, **k: Any) -> Any:
        job = submit(*a, **k)
        count(1)
        return job

    def dying_batch(tenant: str, batch: list[Any], *a: Any, **k: Any) -> Any:
        refused = submit_batch(tenant, batch, *a, **k)
        count(len(batch) - len(refused))
        return refused

    dispatcher.submit = dying  # type: ignore[method-assign]
    dispatcher.submit_batch = dying_batch  # type: ignore[method-assign]
    ticker = Ticker(dispatcher, lambda: args["base"] + (time.time() - args["start"]) * args["speed"], name=args["name"])
    if args["split"]:
        ticker.lead = lambda: True  # type: ignore[method-assign]
    done: Counter[str] = Counter()
    while not r.exists(args["stop"]):
        done.update(ticker.step())
        time.sleep(PASS_S)
    ticker.release()
    print(json.dumps({"name": args["name"], **done}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
