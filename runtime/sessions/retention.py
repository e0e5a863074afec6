"""The retention of sessions: one idle for session_retention_s (no unfinished job, not used
since) is deleted whole, its Redis state and its SQL rows (lifecycle.delete_session, under its
lease), by the workers' reaper, a bounded batch a pass, the longest idle first: found through
the index on sessions.updated_at, never by a scan of the table or of the keyspace.  What the
jobs side keeps of a deleted session (its affinity, its jobs' event streams) goes with it, as
after a DELETE by its tenant (`forget`: Dispatcher.forget_session)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from runtime.errors import Busy, NotFound
from runtime.sessions import lifecycle
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore

log = logging.getLogger("setflow.sessions")
BATCH = 100  # sessions one pass deletes at most (every reaper_interval_s: 20/s at the defaults)


def prune(store: SessionStore, records: Records, retention_s: float, limit: int = BATCH,
          forget: Callable[[str, str, list[str]], None] | None = None) -> int:
    """Delete up to `limit` sessions idle for retention_s; returns how many.  One used meanwhile
    (a job submitted, a turn running, deleted by its tenant) is left be.  forget(session, tenant,
    its deleted jobs' ids): called after each."""
    before = datetime.now(UTC) - timedelta(seconds=retention_s)
    deleted = 0
    for session, tenant in records.idle(before, limit):
        try:
            jobs = lifecycle.delete_session(store, records, session, tenant, idle_only=True, before=before)
            deleted += 1
        except (Busy, NotFound):
            continue
        if forget is not None:
            forget(session, tenant, jobs)
    if deleted:
        log.info("retention: %d sessions idle since %s deleted", deleted, before.isoformat())
    return deleted
