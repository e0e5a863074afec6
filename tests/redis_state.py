"""What a test asks of Redis as a whole (scans: fine in tests, never in the runtime)."""

from __future__ import annotations

import json

from runtime.sessions.store import SessionStore


def orphan_segments(store: SessionStore) -> set[str]:
    """Segment ids that no stored manifest names (committed or written behind)."""
    r, k = store.r, store.k
    named: set[str] = set()
    for key in r.scan_iter(k.manifest("*"), count=1000):
        body = r.hget(key, "body")
        if body is not None:
            m = json.loads(body)
            named.update(m["segments"], m.get("behind", []))
    stored = {k.segment_id(key) for key in r.scan_iter(k.segments, count=1000)}
    return stored - named
