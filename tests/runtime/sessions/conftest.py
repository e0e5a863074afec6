"""The engine's fixtures (test_engine*.py): the shipped model, settings with a data folder, and an
Engine over them.  A module that overrides `client` (with any_client) runs them on a Redis
Cluster too."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine as SqlEngine

from model import shipped
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.sessions.engine import Engine
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings


@pytest.fixture(scope="module")
def loaded() -> tuple[SetDLM, Tokenizer]:
    return shipped.load()


@pytest.fixture
def db_settings(settings: Settings, tmp_path: Path, any_url: str) -> Settings:
    return settings.model_copy(update={"data_dir": tmp_path, "redis_url": any_url})


@pytest.fixture
def engine(loaded: tuple[SetDLM, Tokenizer], client: redis.Redis, db_settings: Settings,
           db_engine: SqlEngine) -> Engine:
    """The engine on a SQLite file and on PostgreSQL (where one answers)."""
    return Engine(loaded[0], SessionStore(client, db_settings), Records(db_engine), db_settings)
