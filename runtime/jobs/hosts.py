"""Which models the live workers host: each worker's model (its name and weights' fingerprint)
and numerics (device kind and dtype), published in Redis with a heartbeat of its own; what a new
session is bound to, and what a job of a bound session may run on.  No torch: the API reads it.

    beat:    a worker says it hosts `host` (three keys in one pipeline); a host stays known for
             host_grace_s after its last beat (a restart does not refuse its jobs), a worker's
             own record (routing's affinity) for three heartbeats
    choose:  the host a new session of a model is bound to (the one most workers host)
    require: a bound session's host, while some worker hosted it within host_grace_s;
             ModelNotHosted else

A host's `pool` names its shared queues (runtime/jobs/routing.py): every worker of one model
and numerics serves them.  Weights of one name and numerics that differ (a rolling upgrade)
share a pool; the engine refuses a session bound to other weights (BadInput), so they must
not be mixed under one name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from runtime.errors import ModelNotHosted
from runtime.keys import Keys, model_name
from runtime.settings import Settings

__all__ = ["Host", "Hosts", "model_name", "pool", "pool_model"]


@dataclass(frozen=True)
class Host:
    model: str  # the model's name (its config's, through model_name)
    fingerprint: str  # its weights' (the engine's fingerprint prefix)
    numerics: str  # "cpu/float32", "cuda/bfloat16": where and in what dtype it runs

    @property
    def id(self) -> str:
        return f"{self.model}/{self.numerics}/{self.fingerprint}"

    @property
    def pool(self) -> str:
        return pool(self.model, self.numerics)

    @classmethod
    def parse(cls, host_id: str) -> Host:
        """ValueError for a string that is no host's id."""
        model, device, dtype, fp = host_id.split("/")
        return cls(model, fp, f"{device}/{dtype}")

    @classmethod
    def read(cls, got: Any) -> Host | None:
        """A host key's value as Redis gave it (bytes, str or None): its Host, None for none or
        a value that is no host's id."""
        try:
            return cls.parse(got.decode() if isinstance(got, bytes) else str(got)) if got is not None else None
        except ValueError:
            return None


def pool(model: str, numerics: str) -> str:
    """The queue-name part of a model and its numerics: "small.cpu-float32"."""
    return f"{model}.{numerics.replace('/', '-')}"


def pool_model(pool_name: str) -> str:
    """The model of a pool ("small.cpu-float32" -> "small"; a model's name may hold dots, its
    numerics none); "" for none."""
    return pool_name.rsplit(".", 1)[0] if pool_name else ""


class Hosts:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.r, self.s, self.k = client, settings, Keys(settings.key_prefix)

    @property
    def _window_s(self) -> float:
        return max(3 * self.s.worker_heartbeat_s, self.s.host_grace_s)

    def _since(self) -> float:
        return time.time() - self._window_s

    def beat(self, worker: str, host: Host) -> None:
        now = time.time()
        pipe = self.r.pipeline(transaction=False)
        pipe.set(self.k.host(worker), host.id, px=int(3000 * self.s.worker_heartbeat_s))
        pipe.zadd(self.k.hosts, {host.id: now})
        pipe.zadd(self.k.hosted(host.id), {worker: now})
        pipe.zremrangebyscore(self.k.hosted(host.id), "-inf", now - self._window_s)
        pipe.zremrangebyscore(self.k.hosts, "-inf", now - self._window_s)
        pipe.execute()

    def gone(self, worker: str) -> None:
        """A worker that stops: no job is routed to it any more; what it hosted stays known for
        host_grace_s (its replacement is usually on its way: its sessions' jobs wait for it)."""
        self.r.delete(self.k.host(worker))

    def of(self, worker: str) -> Host | None:
        """What a live worker hosts (None: it published nothing, or is dead)."""
        return Host.read(self.r.get(self.k.host(worker)))

    def live(self) -> list[Host]:
        """Every host some worker beat for within host_grace_s."""
        out = []
        for h in self.r.zrangebyscore(self.k.hosts, self._since(), "+inf"):
            try:
                out.append(Host.parse(h.decode() if isinstance(h, bytes) else str(h)))
            except ValueError:
                continue
        return out

    def workers(self, host: Host) -> list[str]:
        return sorted(w.decode() if isinstance(w, bytes) else str(w)
                      for w in self.r.zrangebyscore(self.k.hosted(host.id), self._since(), "+inf"))

    def most_hosted(self, numerics: str | None = None) -> str | None:
        """The model (in `numerics`, if given) most live workers host, then by name: a
        deployment's default where it names none (a mixed fleet's main model, not whichever
        worker started last).  None: no live worker says what it hosts."""
        count: dict[str, int] = {}
        for h in self.live():
            if numerics in (None, h.numerics):
                count[h.model] = count.get(h.model, 0) + len(self.workers(h))
        ranked = sorted((-n, m) for m, n in count.items() if n)  # most workers, then by name
        return ranked[0][1] if ranked else None

    def choose(self, model: str, numerics: str | None = None) -> Host:
        """The host a new session of `model` (in `numerics`, if given) is bound to: of those
        live, the one most workers host (then by id).  ModelNotHosted where none is live."""
        found = [(len(self.workers(h)), h) for h in self.live()
                 if h.model == model and numerics in (None, h.numerics)]
        found = [(n, h) for n, h in found if n]
        if not found:
            raise ModelNotHosted(_missing(model, numerics, self.live(), self._window_s))
        return max(found, key=lambda nh: (nh[0], nh[1].id))[1]

    def require(self, model: str, numerics: str, fingerprint: str = "") -> Host:
        """A bound session's host (fingerprint "": any weights of that name), while a live
        worker hosts it; ModelNotHosted else."""
        for h in self.live():
            if (h.model, h.numerics) == (model, numerics) and fingerprint in ("", h.fingerprint) and self.workers(h):
                return h
        what = f"{numerics}, weights {fingerprint}" if fingerprint else numerics
        raise ModelNotHosted(_missing(model, what, self.live(), self._window_s))


def _missing(model: str, numerics: str | None, live: list[Host], window_s: float) -> str:
    have = ", ".join(sorted({f"{h.model} ({h.numerics})" for h in live})) or "none"
    want = f"{model} ({numerics})" if numerics else model
    return f"no worker has hosted model {want} in the last {window_s:g} s; hosted: {have}"
