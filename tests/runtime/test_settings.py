"""runtime/settings.py: the one reader of the environment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from runtime.settings import Settings


def test_defaults_are_the_embedded_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    s = Settings()
    assert s.redis_url is None and s.database_url is None and s.segment_bytes == 2**20


def test_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://example:6379/3")
    monkeypatch.setenv("SETFLOW_LEASE_MS", "1234")
    s = Settings()
    assert s.redis_url == "redis://example:6379/3" and s.lease_ms == 1234


@pytest.mark.parametrize("bad", [{"segment_bytes": 2**21}, {"lease_ms": 0}, {"no_such_setting": 1},
                                 {"key_prefix": "sf{x}"}])  # braces would break the keys' cluster hash tags
def test_bad_values_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings(**bad)
