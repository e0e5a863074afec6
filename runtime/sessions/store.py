"""SessionStore: a session's state in Redis, as bytes (no torch).

- segments: immutable K/V chunks (runtime/sessions/segments.py), written in one transaction
  *before* the manifest that names them, each under its own random id, and recorded as the
  session's pending writes (with a deadline) until a manifest names them;
- manifest: one hash per session (gen, body, tenant).  It is the commit point: it changes only
  by compare-and-set on its generation, in a Lua script (scripts.py) that also checks the
  writer's lease token and that every segment it names exists, so a stale or duplicated writer
  is refused (StaleWrite / LeaseLost), never applied, and a reader never follows a name to
  nothing.

No orphan, by construction: each segment has a reference count (the manifests that name it:
a fork's child names its parent's segments too).  The script that changes a manifest (commit,
evict, drop) moves the counts of the segments it names and no longer names, and deletes those
that reach 0, in the same atomic step.  What a writer wrote and never named goes with the sweep.

SessionStore is also the session's lease (lease.py: one holder at a time, the fence of every
write) and its budgets (budget.py: tenants' accounts, eviction, the sweep).

Redis Cluster: every script touches one session's keys, which share its hash tag (one slot,
runtime/keys.py); a fork there copies its parent's segments instead of sharing them (through
the forking process, COPY_BATCH at a time: Redis copies no key across slots).  On one server a
fork reads its parent's segment headers and the one segment its slot cuts, never its whole K/V.

Keys are in runtime/keys.py.

What a committed manifest's state holds, as JSON beside the K/V segments (no torch): the decode
state, the last turn's parameters, the slots' (position, token) ledger in commit order, and how
many turns it holds.  Written by a turn's save and by a fork; read by a restore."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from model.params import DecodeParams, DecodeState
from runtime.errors import BadInput, CorruptState, LeaseLost, NotFound, OverBudget, StaleWrite
from runtime.keys import Keys, owner, segment_id
from runtime.replies import text
from runtime.sessions import segments
from runtime.sessions.budget import Budgets
from runtime.sessions.lease import Lease, Leases
from runtime.sessions.scripts import Commit, Forget, Scripts, Status
from runtime.settings import Settings

COPY_BATCH = 8  #: segments a fork on a Redis Cluster copies at a time (at most 8 x segment_bytes in memory)


@dataclass(frozen=True)
class Manifest:
    session: str
    tenant: str
    fingerprint: str  # the model whose K/V the segments hold
    gen: int = 0  # 0: never committed
    segments: list[str] = field(default_factory=list)  # segment ids, in slot order
    slots: int = 0  # committed slots (the segments cover [0, slots))
    state: dict[str, Any] = field(default_factory=dict)  # decode state, params, cursor, RNG (JSON)
    nbytes: int = 0  # bytes of the segments it names (set by commit)
    # segments a turn in progress has written behind its decoding: named (so they are budgeted,
    # kept alive and never collected) but not part of the state above until the turn commits
    behind: list[str] = field(default_factory=list)

    def body(self) -> str:
        """JSON; the byte count is filled in by the commit script, which measures the segments."""
        return json.dumps({"fingerprint": self.fingerprint, "segments": self.segments, "slots": self.slots,
                           "state": self.state, "behind": self.behind, "nbytes": "@BYTES@"},
                          separators=(",", ":"))


class SessionStore(Leases, Budgets):
    """A session's segments and manifest; its lease (Leases) and budgets (Budgets) too."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.r = client
        self.s = settings
        self.k = Keys(settings.key_prefix)
        self.scripts = Scripts(client, self.k)
        #: on a Redis Cluster a fork copies its parent's segments (they lie in the parent's slot)
        self.cluster = isinstance(client, redis.RedisCluster)

    # ---- segments ---------------------------------------------------------------------------

    def put_segments(self, session: str, tenant: str, blobs: list[bytes]) -> list[str]:
        """Write a session's segments (one transaction); returns their new ids.  Until a
        manifest names them they are the session's pending writes: counted in the tenant's
        account, and deleted by sweep() once 2 lease periods have passed unnamed."""
        for b in blobs:
            if len(b) > self.s.segment_bytes:
                raise BadInput(f"segment of {len(b)} bytes > segment_bytes {self.s.segment_bytes}")
        if not blobs:
            return []
        ids = [segment_id(session, secrets.token_hex(12)) for _ in blobs]
        ttl_ms, due = self.s.session_ttl_s * 1000, int(time.time() * 1000) + 2 * self.s.lease_ms
        self._count_pending(tenant, session, sum(len(b) for b in blobs), due)  # first (budget.py)
        pipe = self.r.pipeline(transaction=True)  # the session's slot
        for i, b in zip(ids, blobs):
            pipe.set(self.k.segment(i), b, px=ttl_ms)
        pipe.zadd(self.k.pending(session), dict.fromkeys(ids, due))
        pipe.pexpire(self.k.pending(session), ttl_ms)
        pipe.execute()
        return ids

    def get_segments(self, ids: list[str]) -> list[bytes]:
        """Read segments (one pipeline).  A missing one is CorruptState: a manifest named it."""
        pipe = self.r.pipeline(transaction=False)
        for i in ids:
            pipe.get(self.k.segment(i))
        out = pipe.execute()
        for i, b in zip(ids, out):
            if b is None:
                raise CorruptState(f"segment {i} is missing")
        return out

    def read_bytes_per_s(self, n: int = 4) -> float:
        """Pipelined GET bandwidth of n segment-sized values (probe keys: a short TTL, deleted after)."""
        keys = [self.k.probe(secrets.token_hex(8)) for _ in range(n)]
        blob = b"\x00" * self.s.segment_bytes
        pipe = self.r.pipeline(transaction=False)
        for key in keys:
            pipe.set(key, blob, px=60_000)
        pipe.execute()
        t = time.perf_counter()
        pipe = self.r.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        pipe.execute()
        rate = n * len(blob) / max(time.perf_counter() - t, 1e-6)
        self.r.delete(*keys)
        return rate

    # ---- manifest ---------------------------------------------------------------------------

    def read(self, session: str) -> Manifest | None:
        return self._parse(session, self.r.hgetall(self.k.manifest(session)))

    def _parse(self, session: str, got: dict[Any, Any]) -> Manifest | None:
        if not got:
            return None
        try:
            body = json.loads(got[b"body"])
            return Manifest(session, text(got[b"tenant"]), body["fingerprint"], int(got[b"gen"]),
                            list(body["segments"]), int(body["slots"]), dict(body["state"]), int(body["nbytes"]),
                            list(body.get("behind", [])))
        except (KeyError, ValueError, TypeError) as e:
            raise CorruptState(f"manifest of {session} is unreadable: {e}") from e

    def commit(self, m: Manifest, lease: Lease, keep: frozenset[str] = frozenset()) -> Manifest:
        """Compare-and-set: writes m as generation m.gen + 1 if the stored generation is still
        m.gen and `lease` still holds the session, within the session's byte budget and, after
        evicting the tenant's least recently used idle sessions if needed, the tenant's.  The
        segments the stored manifest named and m does not are released (deleted when no other
        manifest names them).  keep: sessions not to evict (a fork's parent).  Returns the
        stored manifest (gen and nbytes set)."""
        if lease.session != m.session:
            raise BadInput(f"lease of {lease.session} cannot commit {m.session}")
        evicted: set[str] = set()
        while True:
            done = self._try_commit(m, lease)
            if done.status == Status.OK:
                return replace(m, gen=m.gen + 1, nbytes=done.nbytes)
            if done.status == Status.STALE:
                raise StaleWrite(f"{m.session}: expected generation {m.gen}, the store holds {done.detail}")
            if done.status == Status.LEASE:
                raise LeaseLost(f"{m.session}: the lease expired or is held by another writer")
            if done.status == Status.MISSING:
                raise CorruptState(f"{m.session}: the manifest names a missing segment {done.detail}")
            if done.status == Status.SESSION_BUDGET:
                raise OverBudget(f"{m.session}: {done.detail} bytes > session budget {self.s.session_budget_bytes}")
            assert done.status == Status.TENANT_BUDGET, done
            victim = self._evict_lru(m.tenant, exclude={m.session} | evicted | keep)
            if victim is None:
                streams = max(0, int(self.r.hget(self.k.event_bytes(m.tenant), "*") or 0))
                raise OverBudget(f"tenant {m.tenant}: {done.detail} bytes > tenant budget {self.s.tenant_budget_bytes} "
                                 f"({streams} of them its jobs' event streams, which expire events_ttl_s after their "
                                 "last event), and no idle session is left to evict")
            evicted.add(victim)

    def _try_commit(self, m: Manifest, lease: Lease) -> Commit:
        """One try: the stored manifest and the tenant's account read, the commit script run,
        and on success the account moved (budget.py)."""
        k = self.k
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(k.manifest(m.session))
        pipe.hget(k.totals, m.tenant)
        pipe.hget(k.tenant_bytes(m.tenant), m.session)
        pipe.hget(k.event_bytes(m.tenant), "*")  # its jobs' event streams (runtime/jobs/events.py)
        got, total, counted, streams = pipe.execute()
        stored = self._parse(m.session, got) if m.gen else None  # what the script replaces, if it is still there
        if m.gen and (stored is None or stored.gen != m.gen):
            return Commit(Status.STALE, "0" if stored is None else str(stored.gen))
        old = _named(stored)
        new = _named(m)
        if self.cluster and (foreign := [i for i in new if owner(i) != m.session]):
            raise BadInput(f"{m.session}: on a Redis Cluster a manifest names its own segments only, not {foreign[0]}")
        held = int(counted or 0)  # what the account holds for this session now
        done = self.scripts.commit(
            session=m.session, tenant=m.tenant, token=lease.token, gen=m.gen, body=m.body(),
            added=[i for i in new if i not in old], kept=[i for i in new if i in old],
            removed=[i for i in old if i not in new], ttl_ms=self.s.session_ttl_s * 1000,
            session_budget=self.s.session_budget_bytes, tenant_budget=self.s.tenant_budget_bytes,
            account=int(total or 0) + max(0, int(streams or 0)), held=held)
        if done.status == Status.OK:
            self._account(m.tenant, m.session, done.nbytes - held - done.pending, done.nbytes, done.first_pending)
        return done

    # ---- forks, drops -----------------------------------------------------------------------

    def fork(self, parent: Manifest, child: str, slot: int, lease: Lease,
             state: dict[str, Any] | None = None) -> Manifest:
        """A new session sharing the parent's K/V of slots [0, slot): the segments below slot are
        shared (copy on write: segments are immutable; each counts the manifests that name it),
        the one that slot cuts is re-written with its first part only.  `lease` is the child's;
        `state` its manifest's state (what a restore reads; default empty: nothing to restore).
        What this process reads of the parent: its segments' headers (heads()) and the one
        segment the slot cuts (at most segment_bytes), never its whole K/V.  On a Redis Cluster
        the segments below slot are copied into the child's slot instead (a script touches one
        slot), COPY_BATCH of them at a time."""
        if not 0 < slot <= parent.slots:
            raise BadInput(f"fork slot {slot} outside (0, {parent.slots}]")
        below: list[str] = []  # the segments wholly below slot
        cut: str | None = None  # the one slot cuts
        for sid, meta in zip(parent.segments, self.heads(parent.segments, parent.fingerprint)):
            if meta.end <= slot:
                below.append(sid)
                continue
            if meta.start < slot:
                cut = sid
            break
        ids = [] if self.cluster else list(below)
        if self.cluster:  # copies in the child's slot (its account counts them as copies either way)
            for i in range(0, len(below), COPY_BATCH):
                ids += self.put_segments(child, parent.tenant, self.get_segments(below[i:i + COPY_BATCH]))
        if cut is not None:
            meta, payload = segments.decode(self.get_segments([cut])[0], parent.fingerprint)
            first = segments.encode(meta.with_slots(meta.start, slot), payload[:(slot - meta.start) * meta.slot_bytes])
            ids += self.put_segments(child, parent.tenant, [first])
        # the parent is not evicted to make room: it holds the shared segments (which the child's
        # account counts again: forks are budgeted as copies)
        return self.commit(Manifest(child, parent.tenant, parent.fingerprint, segments=ids, slots=slot,
                                    state=dict(state or {})), lease, keep=frozenset({parent.session}))

    def heads(self, ids: list[str], fingerprint: str | None = None) -> list[segments.SegmentMeta]:
        """The segments' headers (GETRANGE of their first bytes, one pipeline): the slots each
        holds, without reading its K/V.  CorruptState for a missing or damaged one."""
        pipe = self.r.pipeline(transaction=False)
        for i in ids:
            pipe.getrange(self.k.segment(i), 0, segments.HEADER.size - 1)
        out = []
        for i, head in zip(ids, pipe.execute()):
            if not head:
                raise CorruptState(f"segment {i} is missing")
            out.append(segments.header(head, fingerprint))
        return out

    def drop(self, session: str, tenant: str, lease: Lease | None = None) -> int:
        """Delete a session's Redis state for good (the session itself is deleted): its manifest,
        its place in the LRU orders and the tenant's account, and the segments it names
        (written behind included) that no other manifest names: a fork's shared segments stay
        with the fork.  Under `lease` (the caller's, who holds the session), else under a lease
        taken here (Busy while a turn holds it) and given back.  Returns the segments deleted.
        NotFound when the stored manifest is another tenant's; nothing stored: nothing to do
        but the accounts (0).  Its pending writes, if any (a writer that crashed), go with
        sweep() at their deadline."""
        if lease is None:
            with self.lease(session) as held:
                return self._drop(session, tenant, held.lease)
        return self._drop(session, tenant, lease)

    def _drop(self, session: str, tenant: str, lease: Lease) -> int:
        if lease.session != session:
            raise BadInput(f"lease of {lease.session} cannot drop {session}")
        forgot = self._release_state(session, tenant, lease.token)
        if forgot.status == Status.LEASE:
            raise LeaseLost(f"{session}: the lease expired or is held by another writer")
        if forgot.status == Status.STALE:  # only a writer under this lease moves it: not while we hold it
            raise StaleWrite(f"{session}: the manifest changed while it was being dropped")
        return forgot.deleted

    def _release_state(self, session: str, tenant: str, token: str) -> Forget:
        """The manifest goes (by its lease holder's token, or "" for an idle session), in one
        script with its segments' counts, then the tenant's account: OK with the segments
        deleted, else why not (LEASED, LEASE, STALE)."""
        m = self.read(session)
        if m is not None and m.tenant != tenant:
            raise NotFound(f"no session {session!r} for tenant {tenant!r}")
        forgot = self.scripts.forget(session=session, named=_named(m), token=token, gen=None if m is None else m.gen)
        if forgot.status == Status.OK:
            self._uncount(tenant, session)
        return forgot


def _named(m: Manifest | None) -> list[str]:
    """The segment ids a manifest names (committed, then written behind), each once."""
    return [] if m is None else list(dict.fromkeys(m.segments + m.behind))


def params_json(p: DecodeParams) -> dict[str, Any]:
    """A turn's parameters as its SQL row and the manifest keep them: every field a request can
    give (DecodeParams.to_dict: the guide, a Python object, is not)."""
    return p.to_dict()


def turn_state(decode: DecodeState, params: dict[str, Any], positions: list[int], tokens: list[int],
               turns: int) -> dict[str, Any]:
    """The state of a manifest whose segments hold `turns` turns: slot i holds (positions[i], tokens[i])."""
    return {"decode": decode.to_json(), "params": params, "ledger": [positions, tokens], "turns": turns}


def read_state(state: dict[str, Any]) -> tuple[DecodeState, list[int], list[int]]:
    """-> (decode state, positions, tokens) of a committed manifest; CorruptState when unreadable."""
    try:
        led = state["ledger"]
        return DecodeState.from_json(state["decode"]), list(led[0]), list(led[1])
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise CorruptState(f"manifest state unreadable: {e!r}") from e


def replayed(ledger: list[tuple[int, int]], rng: str | None) -> DecodeState:
    """The decode state of a session whose turns committed `ledger` (commit order): its token at
    every position, nothing pending, the last turn's RNG.  What a recompute rebuilds and a fork
    stores."""
    seq = [0] * (max(p for p, _ in ledger) + 1 if ledger else 0)
    for p, t in ledger:
        seq[p] = t
    return DecodeState(tokens=seq, rng=rng)
