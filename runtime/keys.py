"""Every Redis key setflow writes, in one place.  All start with Settings.key_prefix.

    {p}:m:{session}     hash   the manifest: gen (the fencing counter), body (JSON), tenant
    {p}:seg:{id}        string one immutable KV segment (header + K/V bytes of a slot range)
    {p}:lease:{session} string the lease holder's token, with a PX expiry
    {p}:used            zset   session -> last use (ms): the LRU order for eviction
    {p}:bytes:{tenant}  hash   session -> KV bytes held in Redis (tenant budget accounting)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str

    def manifest(self, session: str) -> str:
        return f"{self.prefix}:m:{session}"

    def segment(self, seg_id: str) -> str:
        return f"{self.prefix}:seg:{seg_id}"

    def lease(self, session: str) -> str:
        return f"{self.prefix}:lease:{session}"

    @property
    def used(self) -> str:
        return f"{self.prefix}:used"

    def tenant_bytes(self, tenant: str) -> str:
        return f"{self.prefix}:bytes:{tenant}"

    @property
    def segment_pattern(self) -> str:
        return f"{self.prefix}:seg:*"
