"""runtime/jobs/hosts.py (its model cards) on a real Redis: a card round-trips (config, tokenizer), the pointer
names the current one, a card is found by its fingerprint after another took the pointer, a
hash that is not a card reads as none; the cache sees a first card at once and a new pointer
after its recheck interval."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis

import model
from model.config import ModelConfig
from runtime.jobs import hosts as models
from runtime.jobs.hosts import Cards, Host, Hosts, ModelCard, NoModel
from runtime.keys import Keys
from runtime.settings import Settings

TOKENIZER = (Path(model.__file__).resolve().parent / "shipped" / "tokenizer.json").read_text()


def card(fingerprint: str, **config: object) -> ModelCard:
    return ModelCard(fingerprint, ModelConfig.from_name("small", **config), TOKENIZER)


def test_a_card_round_trips_and_the_pointer_names_the_current_one(client: redis.Redis, settings: Settings) -> None:
    assert models.read(client, settings) is None
    a, b = card("aaaa000011112222"), card("bbbb000011112222", max_seq_len=512)
    models.publish(client, settings, a)
    got = models.read(client, settings)
    assert got is not None and (got.fingerprint, got.config, got.tokenizer_json) == (a.fingerprint, a.config, TOKENIZER)
    assert got.tokenizer.decode(got.tokenizer.encode("revenue: up 12%")) == "revenue: up 12%"
    models.publish(client, settings, b)
    current = models.read(client, settings)
    assert current is not None and current.fingerprint == b.fingerprint and current.config.max_seq_len == 512
    older = models.read(client, settings, a.fingerprint)  # a session bound to the first model
    assert older is not None and older.config == a.config
    assert models.read(client, settings, "cccc000011112222") is None
    assert client.ttl(Keys(settings.key_prefix).model) == -1  # no expiry: overwritten, never lost


def test_a_hash_that_is_not_a_card_reads_as_none(client: redis.Redis, settings: Settings) -> None:
    k = Keys(settings.key_prefix)
    client.hset(k.model_card("dddd000011112222"), mapping={"fingerprint": "dddd000011112222", "config": "{}"})
    client.set(k.model, "dddd000011112222")
    assert models.read(client, settings) is None
    client.hset(k.model_card("dddd000011112222"), mapping={"config": '{"no_such_field": 1}', "tokenizer": "{}"})
    assert models.read(client, settings) is None


def test_the_cache_sees_a_first_card_at_once_and_a_new_one_after_its_recheck(client: redis.Redis,
                                                                              settings: Settings) -> None:
    seen = Cards(client, settings, recheck_s=0.2)
    with pytest.raises(NoModel) as e:
        seen.require()
    assert e.value.code == "no_model" and "start a worker" in e.value.message
    models.publish(client, settings, card("aaaa000011112222"))
    assert seen.require().fingerprint == "aaaa000011112222"  # no absence was kept
    models.publish(client, settings, card("bbbb000011112222"))
    assert seen.require().fingerprint == "aaaa000011112222"  # within the recheck interval
    time.sleep(0.25)
    assert seen.require().fingerprint == "bbbb000011112222"
    of_a = seen.of("aaaa000011112222")
    assert of_a is not None and of_a is seen.of("aaaa000011112222")  # kept: a card never changes


def test_a_worker_publishes_its_card_again_when_redis_lost_it(client: redis.Redis, settings: Settings) -> None:
    k, stop = Keys(settings.key_prefix), threading.Event()
    mine = card("cccc000011112222")
    thread = models.keep_published(client, settings, mine, every_s=0.05, stop=stop)
    try:
        deadline = time.monotonic() + 5
        while models.read(client, settings) != mine and time.monotonic() < deadline:
            time.sleep(0.02)
        assert models.read(client, settings) == mine, "published at once"
        client.delete(k.model, k.model_card(mine.fingerprint))  # Redis restarted empty
        deadline = time.monotonic() + 5
        while models.read(client, settings) != mine and time.monotonic() < deadline:
            time.sleep(0.02)
        assert models.read(client, settings) == mine, "published again"
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


def test_a_worker_has_said_what_it_hosts_before_keep_published_returns(client: redis.Redis, settings: Settings) -> None:
    """The first round runs in the caller: a worker takes no job before its host is known (a
    starved thread said it seconds later, and a job submitted meanwhile went to another host)."""
    stop, mine = threading.Event(), card("dddd000011112222")
    host = Host("small", mine.fingerprint, "cpu/float32")
    thread = models.keep_published(client, settings, mine, every_s=60, stop=stop, host=("w1", host))
    try:
        assert models.read(client, settings) == mine and Hosts(client, settings).of("w1") == host
    finally:
        stop.set()
        thread.join(5)
