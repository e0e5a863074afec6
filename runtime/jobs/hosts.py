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

The models workers host, as cards: what a worker publishes of the model it loaded (its
fingerprint, config and tokenizer), so that the API learns a model's vocabulary, context and
tokenizer without a model file or torch.  No TTL: a card is named by its fingerprint.

    publish: the card's hash, then the pointer to it (a reader never follows it to nothing)
    keep_published: a worker's thread that publishes its card again whenever Redis lost it
    read:    the current card (the pointer's), or one model's by its fingerprint
    Cards:   one API process's cache of them (the pointer is read again every few seconds)"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import redis

from model.config import ModelConfig
from model.profiles import Profile
from model.tokenizer import SpecialIds, Tokenizer
from runtime.errors import ModelNotHosted, SetflowError
from runtime.keys import Keys, model_name
from runtime.replies import text as _text
from runtime.settings import Settings

__all__ = ["Cards", "Host", "Hosts", "ModelCard", "NoModel", "keep_published", "model_name", "pool", "pool_model", "publish",
           "read"]


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


log = logging.getLogger("setflow.models")
RECHECK_S = 2.0  # how stale an API process's idea of the current model may be (a new worker's card)
KEPT = 8  # cards one process keeps (several models later; each is its tokenizer, ~15 KB of JSON)


class NoModel(SetflowError):
    """No worker has published its model yet: what needs the model's vocabulary or context
    cannot be checked (a 503: start a worker, then retry)."""

    code = "no_model"
    retry_after_s = 5.0

    def __init__(self) -> None:
        super().__init__("no worker has published its model yet: start a worker (`setflow worker`)")


@dataclass(frozen=True)
class ModelCard:
    fingerprint: str  # the engine's (checkpoint.fingerprint(model)[:16]): what sessions record
    config: ModelConfig
    tokenizer_json: str
    profile_json: str = ""  # its profile (model/profiles.py); "": the model's default

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_str(self.tokenizer_json, SpecialIds.of(self.config))

    @cached_property
    def profile(self) -> Profile:
        """How its prompts are rendered: what a job's positions are counted with (workflows.PLANS)."""
        if self.profile_json:
            return Profile.from_json(self.profile_json)
        return Profile.for_model(self.config, self.tokenizer)

    def to_fields(self) -> dict[str, str]:
        return {"fingerprint": self.fingerprint, "config": self.config.to_json(), "tokenizer": self.tokenizer_json,
                "profile": self.profile_json}

    @classmethod
    def from_fields(cls, fields: Mapping[bytes | str, bytes | str]) -> ModelCard:
        """KeyError or ValueError for a hash that is not a card (a card without a profile,
        published before profiles, is the model's default)."""
        text = {_text(k): _text(v) for k, v in fields.items()}
        return cls(text["fingerprint"], ModelConfig.from_json(text["config"]), text["tokenizer"],
                   text.get("profile", ""))


def publish(client: redis.Redis, settings: Settings, card: ModelCard) -> None:
    """The card, then the pointer (two commands, not a transaction: the keys may lie in two
    slots of a cluster; in this order a reader never finds a pointer without its card)."""
    k = Keys(settings.key_prefix)
    client.hset(k.model_card(card.fingerprint), mapping=card.to_fields())  # type: ignore[arg-type]
    client.set(k.model, card.fingerprint)


def keep_published(client: redis.Redis, settings: Settings, card: ModelCard, every_s: float,
                   stop: threading.Event, host: tuple[str, Host] | None = None) -> threading.Thread:
    """A daemon thread that publishes `card` now and again whenever it or the pointer is gone
    (Redis was away when the worker started, or came back empty), checked every `every_s` until
    `stop` is set.  An EXISTS per interval while all is well.  host: (worker, what it hosts),
    said every interval too (runtime/jobs/hosts.py: its heartbeat as a host of that model).
    The first round runs before this returns: a worker that takes a job has said what it hosts
    (a thread starved by a busy process said it seconds later, and a job submitted meanwhile
    was bound to another host)."""
    k = Keys(settings.key_prefix)
    hosts = Hosts(client, settings)

    def once() -> None:
        try:
            if not (client.exists(k.model_card(card.fingerprint)) and client.exists(k.model)):
                publish(client, settings, card)
            if host is not None:
                hosts.beat(*host)
        except redis.RedisError:
            log.warning("model card not published (Redis away): retrying in %.0f s", every_s)

    def loop() -> None:
        while not stop.wait(every_s):
            once()

    once()

    thread = threading.Thread(target=loop, name="setflow-model-card", daemon=True)
    thread.start()
    return thread


def read(client: redis.Redis, settings: Settings, fingerprint: str | None = None) -> ModelCard | None:
    """The card of `fingerprint` (None: the current one), or None where none was published.  A
    hash that is not a card (another version's) is logged and read as none."""
    k = Keys(settings.key_prefix)
    if fingerprint is None:
        pointer = client.get(k.model)
        if pointer is None:
            return None
        fingerprint = _text(pointer)
    fields = client.hgetall(k.model_card(fingerprint))
    if not fields:
        return None
    try:
        return ModelCard.from_fields(fields)
    except (KeyError, ValueError, TypeError) as e:
        log.warning("model card %s unreadable: %r", fingerprint, e)
        return None


class Cards:
    """The cards as one API process sees them: each card is kept once read (it never changes);
    the pointer is read again after RECHECK_S.  Its absence is not kept: the first worker's card
    is seen at once.  Shared by the request threads; a race reads a card twice, nothing worse."""

    def __init__(self, client: redis.Redis, settings: Settings, recheck_s: float = RECHECK_S) -> None:
        self.r, self.s, self.recheck_s = client, settings, recheck_s
        self._cards: dict[str, ModelCard] = {}
        self._current: tuple[str, float] | None = None  # (fingerprint, when the pointer was read)
        self._lock = threading.Lock()

    def current(self) -> ModelCard | None:
        seen = self._current
        if seen is not None and time.monotonic() - seen[1] < self.recheck_s and seen[0] in self._cards:
            return self._cards[seen[0]]
        card = read(self.r, self.s)
        if card is not None:
            self._keep(card)
            self._current = (card.fingerprint, time.monotonic())
        return card

    def of(self, fingerprint: str) -> ModelCard | None:
        """A model's card by its fingerprint (a session's model), or None where none was published."""
        if fingerprint in self._cards:
            return self._cards[fingerprint]
        card = read(self.r, self.s, fingerprint)
        if card is not None:
            self._keep(card)
        return card

    def require(self) -> ModelCard:
        """The current card; NoModel where no worker has published one."""
        card = self.current()
        if card is None:
            raise NoModel()
        return card

    def _keep(self, card: ModelCard) -> None:
        with self._lock:
            self._cards[card.fingerprint] = card
            while len(self._cards) > KEPT:  # the oldest first (dicts keep insertion order)
                self._cards.pop(next(iter(self._cards)))
