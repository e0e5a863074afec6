"""Turn metrics, kept in Redis so that every worker adds to them and the API reads them all.

Per resume path ("new", "warm", "restore", "recompute", "done"): turns, and a histogram of the
seconds spent loading the session (the resume itself) and of the turn's whole time; per tenant:
turns.  Per checked part (workflows/checked.py: narrative, section, figures, answer): its
outcomes (first, ar_retry, unverified, flagged).  One pipelined HINCRBY/HINCRBYFLOAT round trip
per turn (best effort: a metric never fails a turn).  The API exposes them with KV bytes per
tenant and queue depths (runtime/api/routes/ops.py).

    {p}:metrics   hash   turns|{path}, turns_tenant|{tenant}, {kind}_sum|{path},
                         {kind}_bucket|{path}|{le}   (kind: load, turn; le: BUCKETS, "+Inf"),
                         checked|{part}|{outcome}
"""

from __future__ import annotations

from typing import Any

import redis

from runtime.keys import Keys
from runtime.settings import Settings

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)  # seconds


class TurnMetrics:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.r = client
        self.key = f"{Keys(settings.key_prefix).prefix}:metrics"

    def record(self, tenant: str, path: str, load_s: float, turn_s: float) -> None:
        p = self.r.pipeline(transaction=False)
        p.hincrby(self.key, f"turns|{path}", 1)
        p.hincrby(self.key, f"turns_tenant|{tenant}", 1)
        for kind, v in (("load", load_s), ("turn", turn_s)):
            p.hincrbyfloat(self.key, f"{kind}_sum|{path}", v)
            for le in BUCKETS:
                if v <= le:
                    p.hincrby(self.key, f"{kind}_bucket|{path}|{le}", 1)
            p.hincrby(self.key, f"{kind}_bucket|{path}|+Inf", 1)
        p.execute()

    def checked(self, part: str, outcome: str) -> None:
        self.r.hincrby(self.key, f"checked|{part}|{outcome}", 1)

    def read(self) -> dict[str, Any]:
        """{"turns": {path: n}, "tenants": {tenant: n}, "load"/"turn": {path: {"sum": s,
        "buckets": [(le, cumulative count), ...]}}, "checked": {part: {outcome: n}}}."""
        raw = {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in self.r.hgetall(self.key).items()}
        out: dict[str, Any] = {"turns": {}, "tenants": {}, "load": {}, "turn": {}, "checked": {}}
        for k, v in raw.items():
            name, *rest = k.split("|")
            if name == "checked":
                out["checked"].setdefault(rest[0], {})[rest[1]] = int(v)
            elif name == "turns":
                out["turns"][rest[0]] = int(v)
            elif name == "turns_tenant":
                out["tenants"][rest[0]] = int(v)
            elif name.endswith("_sum"):
                out[name[:-4]].setdefault(rest[0], {"sum": 0.0, "buckets": {}})["sum"] = v
            elif name.endswith("_bucket"):
                out[name[:-7]].setdefault(rest[0], {"sum": 0.0, "buckets": {}})["buckets"][rest[1]] = int(v)
        for kind in ("load", "turn"):
            for h in out[kind].values():
                b = h["buckets"]
                h["buckets"] = [(str(le), b.get(str(le), 0)) for le in BUCKETS] + [("+Inf", b.get("+Inf", 0))]
        return out
