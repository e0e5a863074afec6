"""runtime/settings.py: the one reader of the environment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from runtime.settings import Settings, redact


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


@pytest.mark.parametrize("keys", ['{"sk-shrt": "acme"}', '{"sk-live-0123456789": ""}', '{"sk-live-0123456789": 5}',
                                  '{"ok-key-0123456789": "a", "changeme": "b"}', '["sk-live-0123456789"]'])
def test_a_bad_key_map_names_no_key(monkeypatch: pytest.MonkeyPatch, keys: str) -> None:
    """A refused SETFLOW_API_KEYS names the entry by its place and tenant: no part of any key
    (this error lands in logs and on consoles)."""
    monkeypatch.setenv("SETFLOW_API_KEYS", keys)
    with pytest.raises(ValidationError) as e:
        Settings()
    text = str(e.value)
    assert "entry" in text or "JSON object" in text
    for secret in ("sk-", "ok-key", "changeme", "0123"):
        assert secret not in text


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
    ("postgresql+psycopg://app:p%40ss@db:5432/x?sslmode=require", "postgresql+psycopg://app:***@db:5432/x?sslmode=require"),
    ("postgresql://db/x?user=app&password=zz", "postgresql://db/x?user=app&password=***"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("sqlite:////tmp/setflow.db", "sqlite:////tmp/setflow.db")])
def test_redact_hides_passwords_only(url: str, shown: str) -> None:
    assert redact(url) == shown
