"""What a route tells the middlewares around it (runtime/api/app.py), so that a route imports
none of them: a callable in the request's scope that gives the tenant's turn back (gate.Turns
puts it there), and the headers of its response that the Idempotency-Key middleware reads
(idempotency.Idempotent) and does not send."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

RELEASE = "setflow.release_turn"  #: the scope's state entry: gives the request's turn back (gate.Turns)
STREAMED = "setflow-response-id"  #: the header a streaming route names its response by
#: the header a route names, comma-separated, the fields of its JSON answer that are never kept
#: (a webhook's secret, shown once): its replay answers without them; the header is not sent
UNKEPT = "setflow-unkept"


def release_turn(scope: MutableMapping[str, Any]) -> None:
    """Give the request's turn back (gate.Turns) before a long wait that holds no thread: the
    tenant's other requests need not wait for it.  A no-op outside Turns."""
    release: Callable[[], None] | None = scope.get("state", {}).get(RELEASE)
    if release is not None:
        release()
