"""A session's deletion and its fork, written once for the engine and the API (no torch: the API
process runs them).  Redis through SessionStore, SQL through Records; knows nothing of jobs'
queues, events or HTTP."""

from __future__ import annotations

import logging
from datetime import datetime

import redis

from runtime.errors import Busy, SetflowError
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore, read_state, replayed, turn_state
from runtime.tables import SessionRecord

log = logging.getLogger("setflow.sessions")


def delete_session(store: SessionStore, records: Records, session: str, tenant: str, idle_only: bool = False,
                   before: datetime | None = None) -> list[str]:
    """Delete a session everywhere: its Redis state (store.drop: the manifest, the segments no
    other session names, the byte accounts), then its SQL rows (turns and jobs by cascade;
    idle_only: Busy while a job of it is queued or running; before: Busy when it was used since,
    the retention's).  Returns the deleted jobs' ids.
    NotFound for an unknown or another tenant's session.  Under the session's lease, so no turn
    runs meanwhile (Busy while one does).

    Redis first: a failure between the two leaves a whole session in SQL (its next turn
    recomputes) and the delete can be retried; the other order would leave K/V bytes of a
    deleted session in Redis until their TTL (idle_only is checked before the drop as well, so a
    refused delete keeps the Redis state; a job submitted between the two checks still gets the
    delete refused, and costs the session a recompute).  A Redis failure while dropping does not stop the
    delete (SQL is the truth): it is logged, and what was left expires by itself.  Warm copies
    held by engines are theirs to forget: their next turn on it finds no session (NotFound)."""
    records.get_session(session, tenant)  # NotFound before the lease is taken
    with store.lease(session) as lease:
        if idle_only and records.unfinished_jobs(session):  # refused: its Redis state stays too
            raise Busy(f"session {session} has unfinished jobs; cancel them first")
        if before is not None and records.used_since(session, before):  # the same
            raise Busy(f"session {session} was used since {before.isoformat()}")
        try:
            store.drop(session, tenant, lease.lease)
        except (redis.RedisError, SetflowError) as e:
            log.warning("session %s: its Redis state was not dropped (%s; it expires by itself)", session, e)
        return records.delete_session(session, tenant, idle_only=idle_only, before=before)


def fork_session(store: SessionStore, records: Records, session: str, tenant: str, turn: int,
                 new_id: str | None = None) -> SessionRecord:
    """A new session whose turns are copies of `session`'s turns 0..turn (Records.fork), and,
    when the parent's Redis state holds those turns, a manifest that shares their K/V segments
    (copy on write: SessionStore.fork), so that the child's first turn can restore rather than
    recompute.  Otherwise, or when anything on the Redis side fails, the child has no Redis
    state and its first turn recomputes from SQL (costs time, not data)."""
    child = records.fork(session, tenant, turn, new_id)
    try:
        _share(store, records, session, child)
    except (redis.RedisError, SetflowError) as e:
        log.info("fork %s of %s: no shared Redis state (%s); its first turn recomputes", child.id, session, e)
    return child


def _share(store: SessionStore, records: Records, parent: str, child: SessionRecord) -> None:
    """Commit the child's manifest over the parent's first slots, if the parent's manifest is
    fresh: of the session's model, holding at least the child's turns, and its first slots
    being exactly those turns' ledger (the slot boundary of turn k is the ledger length of turns
    0..k).  Its state is what a turn's save would have written after turn k."""
    rows = records.turns(child.id, child.tenant)  # copies of the parent's turns 0..k
    ledger = [(p, t) for row in rows for p, t in row.ledger]
    m = store.read(parent)
    if (m is None or not rows or m.tenant != child.tenant or m.fingerprint != child.model_fingerprint
            or int(m.state.get("turns", -1)) < len(rows) or m.slots < len(ledger)):
        return
    _, positions, tokens = read_state(m.state)
    n = len(ledger)
    if list(zip(positions[:n], tokens[:n])) != ledger:
        return  # the parent's slots are not these turns' (another history): recompute
    last = rows[-1].meta or {}
    state = turn_state(replayed(ledger, last.get("rng")), last.get("params", {}), positions[:n], tokens[:n],
                       len(rows))
    with store.lease(child.id) as lease:
        store.fork(m, child.id, n, lease.lease, state)
