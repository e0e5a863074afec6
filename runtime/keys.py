"""Every Redis key setflow writes, in one place.  All start with Settings.key_prefix.

A session's keys carry its id as a Redis Cluster hash tag (`{S}`), and so do the segments it
writes (a segment id is "S/random": its writer's id, then its own), so that every script of
runtime/sessions/scripts.py touches one slot: the manifest, the lease, the pending record and the
segments and counts of one session.  What spans sessions (a tenant's LRU order and byte
accounts, the indexes the sweep visits) is written by single-key commands beside the scripts.
On one Redis server the tags change nothing.  Below, `{p}` stands for the prefix and `{tenant}`,
`{job}` ... for values; the braces of `{S}` (a session's id) are written into the key: its tag.

    {p}:m:{S}           hash   the manifest: gen (the fencing counter), body (JSON), tenant
    {p}:seg:{S}:{id}    string one immutable KV segment (header + K/V bytes of a slot range)
    {p}:ref:{S}:{id}    string how many manifests name that segment (it goes at 0)
    {p}:pend:{S}        zset   segment id -> deadline (ms): written, not yet named by a manifest
    {p}:lease:{S}       string the lease holder's token, with a PX expiry
    {p}:pending         zset   [tenant, session] -> its first pending deadline (what sweep() visits)
    {p}:lru:{tenant}    zset   session -> last commit (ms): the tenant's LRU order for eviction
    {p}:used            zset   [tenant, session] -> last commit (ms): expired manifests, oldest first
    {p}:bytes:{tenant}  hash   session -> KV bytes its manifest names (as counted in the account)
    {p}:tenants         hash   tenant -> KV bytes its sessions hold (named and pending): its account
    {p}:probe:{id}      string a scratch value measuring Redis bandwidth (a short TTL)
    {p}:aff:{session}   string the session's last worker (affinity), with a TTL
    {p}:alive:{worker}  string present while the worker is alive (heartbeat with a TTL)
    {p}:workers         zset   worker -> its last heartbeat (s): the live workers, without a scan
    {p}:busy:{worker}   hash   tenant -> the worker's jobs of it running now (expires after the hard time limit)
    {p}:onway:{worker}  zset   [job, tenant] -> when sent to the worker's own queue: until it takes them
    {p}:ev:{job}        stream the job's step events, progress and status changes
    {p}:evbytes:{tenant} hash  job -> bytes of its stream (MEMORY USAGE), `*` -> their sum: in the
                               tenant's budget beside its KV bytes (runtime/jobs/events.py)
    {p}:events_due      zset   [tenant, job] -> when its stream expires (ms): what the sweep visits
    {p}:events_done     zset   [tenant, job] -> when its ended stream is compacted (ms): what the reaper visits
    {p}:event_tenants   set    the tenants that have had a stream (for /metrics)
    {p}:cancel:{job}    string present when the job is to stop (checked every step)
    {p}:rl:{tenant}     hash   the tenant's submission token bucket (tokens, last refill)
    {p}:{fair}:active   zset   tenant -> its last admission (s): the tenants sharing the workers
    {p}:{fair}:use      hash   tenant -> "slot-seconds (decayed) at time": runtime/jobs/fairness.py
    {p}:{fair}:total    string "slot-seconds (decayed) at time", of the active tenants together
    {p}:admitting:{tenant} string the lock of an admission of a tenant held to its share
    {p}:reaper          string the reaper's lock (one reaper at a time across workers)
    {p}:ticker          string the schedules' leader lock: its holder's token, with a PX expiry
    {p}:dead            stream task messages that named no job (malformed payload, unknown id)
    {p}:model           string the fingerprint of the model a worker loaded last (the current card)
    {p}:model:{fp}      hash   that model's card: fingerprint, config (JSON), tokenizer (JSON);
                               no TTL: a card never changes (the fingerprint names the weights)
    {p}:host:{worker}   string what the worker hosts: "model/device/dtype/fingerprint", with a TTL
    {p}:hosts           zset   host id -> its last heartbeat (s): the models and numerics hosted
    {p}:hosted:{id}     zset   worker -> its last heartbeat (s): the workers hosting that host id
    {p}:celery:*        the Celery broker's own keys (queues, unacked), under kombu's global prefix

Segment ids written before tags (no "/") keep their old keys ({p}:seg:{id}, {p}:ref:{id}).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str

    def manifest(self, session: str) -> str:
        return f"{self.prefix}:m:{{{session}}}"

    def segment(self, seg_id: str) -> str:
        return f"{self.prefix}:seg:{_tagged(seg_id)}"

    def lease(self, session: str) -> str:
        return f"{self.prefix}:lease:{{{session}}}"

    def ref(self, seg_id: str) -> str:
        return f"{self.prefix}:ref:{_tagged(seg_id)}"

    def pending(self, session: str) -> str:
        return f"{self.prefix}:pend:{{{session}}}"

    @property
    def segments(self) -> str:
        """The pattern of every segment key (for tests and benchmarks: the runtime never scans)."""
        return f"{self.prefix}:seg:*"

    def segment_id(self, key: str | bytes) -> str:
        """The id of a segment's key (the inverse of segment())."""
        rest = (key.decode() if isinstance(key, bytes) else key).removeprefix(f"{self.prefix}:seg:")
        if rest.startswith("{") and "}:" in rest:
            owner, own = rest[1:].rsplit("}:", 1)
            return f"{owner}/{own}"
        return rest

    @property
    def pending_index(self) -> str:
        return f"{self.prefix}:pending"

    def lru(self, tenant: str) -> str:
        return f"{self.prefix}:lru:{tenant}"

    @property
    def used(self) -> str:
        return f"{self.prefix}:used"

    def tenant_bytes(self, tenant: str) -> str:
        return f"{self.prefix}:bytes:{tenant}"

    @property
    def totals(self) -> str:
        return f"{self.prefix}:tenants"

    def event_bytes(self, tenant: str) -> str:
        return f"{self.prefix}:evbytes:{tenant}"

    @property
    def events_due(self) -> str:
        return f"{self.prefix}:events_due"

    @property
    def events_done(self) -> str:
        return f"{self.prefix}:events_done"

    @property
    def event_tenants(self) -> str:
        return f"{self.prefix}:event_tenants"

    def probe(self, probe_id: str) -> str:
        return f"{self.prefix}:probe:{probe_id}"

    def affinity(self, session: str) -> str:
        return f"{self.prefix}:aff:{session}"

    def going_on(self, session: str) -> str:  # a response being created from the session (runtime/api/openai/chain.py)
        return f"{self.prefix}:goon:{session}"

    def alive(self, worker: str) -> str:
        return f"{self.prefix}:alive:{worker}"

    def busy(self, worker: str) -> str:
        return f"{self.prefix}:busy:{worker}"

    def onway(self, worker: str) -> str:
        return f"{self.prefix}:onway:{worker}"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def events(self, job: str) -> str:
        return f"{self.prefix}:ev:{job}"

    def cancel(self, job: str) -> str:
        return f"{self.prefix}:cancel:{job}"

    def bucket(self, tenant: str) -> str:
        return f"{self.prefix}:rl:{tenant}"

    @property
    def fair_active(self) -> str:  # one hash tag for the three: a script touches them together
        return f"{self.prefix}:{{fair}}:active"

    @property
    def fair_use(self) -> str:
        return f"{self.prefix}:{{fair}}:use"

    @property
    def fair_total(self) -> str:
        return f"{self.prefix}:{{fair}}:total"

    def admitting(self, tenant: str) -> str:
        return f"{self.prefix}:admitting:{tenant}"

    @property
    def reaper(self) -> str:
        return f"{self.prefix}:reaper"

    @property
    def ticker(self) -> str:
        return f"{self.prefix}:ticker"

    @property
    def dead(self) -> str:
        return f"{self.prefix}:dead"

    @property
    def model(self) -> str:
        return f"{self.prefix}:model"

    def model_card(self, fingerprint: str) -> str:
        return f"{self.prefix}:model:{fingerprint}"

    def host(self, worker: str) -> str:
        return f"{self.prefix}:host:{worker}"

    @property
    def hosts(self) -> str:
        return f"{self.prefix}:hosts"

    def hosted(self, host_id: str) -> str:
        return f"{self.prefix}:hosted:{host_id}"

    @property
    def broker(self) -> str:
        return f"{self.prefix}:celery:"


def model_name(name: str) -> str:
    """A model's name as sessions, queues and keys carry it (its config's name): letters,
    digits, '.', '_' and '-', at most 64."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)[:64] or "model"


def segment_id(session: str, own: str) -> str:
    """A new segment's id: its writer's session (its hash tag), then its own random part."""
    return f"{session}/{own}"


def owner(seg_id: str) -> str | None:
    """The session that wrote a segment (None: an id written before tags)."""
    who, sep, _ = seg_id.rpartition("/")
    return who if sep else None


def _tagged(seg_id: str) -> str:
    """ "S/x" -> "{S}:x" (the writer's slot); an id written before tags stays as it was."""
    owner, sep, own = seg_id.rpartition("/")
    return f"{{{owner}}}:{own}" if sep else seg_id
