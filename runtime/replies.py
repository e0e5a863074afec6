"""Redis replies as Python text: a client may answer bytes (the default) or str
(decode_responses); this reads either.  Knows nothing of keys or of what the text means."""

from __future__ import annotations

from typing import Any


def text(x: Any) -> str:
    """A reply (bytes, str, or a number a script returned) as str."""
    return x.decode() if isinstance(x, bytes) else str(x)
