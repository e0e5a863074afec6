"""The models workers host, as cards: what a worker publishes of the model it loaded (its
fingerprint, config and tokenizer), so that the API learns a model's vocabulary, context and
tokenizer without a model file or torch.  No TTL: a card is named by its fingerprint.

    publish: the card's hash, then the pointer to it (a reader never follows it to nothing)
    keep_published: a worker's thread that publishes its card again whenever Redis lost it
    read:    the current card (the pointer's), or one model's by its fingerprint
    Cards:   one API process's cache of them (the pointer is read again every few seconds)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import redis

from model.config import ModelConfig
from model.profiles import Profile
from model.tokenizer import SpecialIds, Tokenizer
from runtime.errors import SetflowError
from runtime.jobs.hosts import Host, Hosts
from runtime.keys import Keys
from runtime.replies import text as _text
from runtime.settings import Settings

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
