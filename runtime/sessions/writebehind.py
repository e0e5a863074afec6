"""Write-behind: a turn's committed K/V go to Redis while the turn is still decoding.

The decoding thread hands over slot ranges as segment bytes (a bounded queue: when Redis falls
behind, decoding waits rather than buffering without limit); one writer thread puts them and
advances the manifest by compare-and-set under the turn's lease, naming them as `behind`.  The
manifest's state (what a restore reads) stays the last completed turn's until the turn commits,
so an interrupted turn that started warm or restored leaves that turn restorable (one that
started by recomputing leaves the session to recompute again); the next commit of the session
releases what was written behind.  A write that
fails (budget, lease, anything) stops the write-behind; the turn's final save then writes the
turn's slots again.  A write Redis refused at its maxmemory (OOM) is first tried again for up to
OOM_RETRY_S: memory frees as the reaper evicts sessions and compacts or expires streams.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace

from runtime.sessions.ceilings import oom
from runtime.sessions.lease import Lease
from runtime.sessions.store import Manifest, SessionStore

OOM_RETRY_S = 5.0  # a batch refused at maxmemory is tried again this long (the lease lasts lease_ms)


class WriteBehind:
    def __init__(self, store: SessionStore, base: Manifest, lease: Lease, max_queue: int = 4) -> None:
        self.store = store
        self.lease = lease
        self.manifest = base  # the latest stored manifest (generation included)
        self.error: Exception | None = None
        self._q: queue.Queue[list[bytes] | None] = queue.Queue(max_queue)
        self._thread = threading.Thread(target=self._run, name="setflow-write-behind", daemon=True)
        self._thread.start()

    def submit(self, blobs: list[bytes]) -> None:
        """Queue segments for writing (blocks while the queue is full)."""
        if self.error is None and blobs:
            self._q.put(blobs)

    def close(self) -> Manifest:
        """Wait for every queued write; returns the latest stored manifest."""
        self._q.put(None)
        self._thread.join()
        return self.manifest

    def _run(self) -> None:
        while True:
            blobs = self._q.get()
            if blobs is None:
                return
            if self.error is not None:
                continue  # stopped: drain without writing
            try:
                self._write(blobs)
            except Exception as e:  # noqa: BLE001 - any failure stops the write-behind, never the thread:
                self.error = e  # a dead writer would leave the decoding blocked on the full queue

    def _write(self, blobs: list[bytes]) -> None:
        """Put the batch, then name it in the manifest; each step tried again while Redis refuses
        it at its maxmemory, for up to OOM_RETRY_S (backoff 0.05 s doubling to 1 s)."""
        deadline, delay = time.monotonic() + OOM_RETRY_S, 0.05
        ids: list[str] | None = None
        while True:
            try:
                if ids is None:
                    ids = self.store.put_segments(self.manifest.session, self.manifest.tenant, blobs)
                m = replace(self.manifest, behind=self.manifest.behind + ids)
                self.manifest = self.store.commit(m, self.lease)
                return
            except Exception as e:
                if not oom(e) or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
