"""The database engine from Settings (a SQLite file under data_dir by default, PostgreSQL via
DATABASE_URL) and its schema migrations (Alembic).  The tables are runtime/tables.py; what reads
and writes them lives with its owner: runtime/sessions/records.py, runtime/jobs/rows.py."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event

from runtime.settings import Settings

MIGRATIONS = Path(__file__).parent / "migrations"
WRITE = "setflow_write"  # execution option: this transaction writes


def database_url(settings: Settings) -> str:
    if settings.database_url:
        return settings.database_url
    return f"sqlite:///{(settings.data_dir / 'setflow.db').resolve()}"


def private(file: Path) -> None:
    """A data file's folder is created 0700 and the file 0600 when they are new (a folder that
    exists already is the operator's: left as it is)."""
    if file.name == ":memory:" or not file.name:
        return
    file.parent.mkdir(parents=True, mode=0o700, exist_ok=True)  # the mode applies only where it is made
    if not file.exists():
        os.close(os.open(file, os.O_CREAT | os.O_WRONLY, 0o600))


def make_engine(settings: Settings, migrate: bool = True) -> Engine:
    url = database_url(settings)
    if url.startswith("sqlite"):
        private(Path(url.removeprefix("sqlite:///")))
    timeout = settings.database_timeout_s
    # a connection is pinged before the pool hands it out (one dropped by the server, a restart or
    # a proxy is replaced, not given to a request), and connecting waits at most `timeout`
    connect_args: dict[str, object] = ({"timeout": timeout} if url.startswith("sqlite")
                                       else {"connect_timeout": max(2, math.ceil(timeout))}
                                       if url.startswith("postgresql") else {})  # libpq: whole seconds, >= 2
    # hide_parameters: an error's log line names its statement, never its values (a webhook's secret)
    engine = create_engine(url, future=True, pool_pre_ping=True, connect_args=connect_args, hide_parameters=True)
    if engine.dialect.name == "sqlite":
        @event.listens_for(engine, "connect")
        def _fk_on(conn, _record):  # type: ignore[no-untyped-def]  # SQLite enforces FKs only when asked
            conn.execute("PRAGMA foreign_keys=ON")
            # several worker processes write one file: readers do not block the writer (WAL), and
            # a writer waits for another's lock instead of failing at once
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            conn.isolation_level = None  # the driver emits no BEGIN of its own: _begin below does

        @event.listens_for(engine, "begin")
        def _begin(conn):  # type: ignore[no-untyped-def]
            # a transaction that reads, then writes, must hold the write lock from its start: a
            # deferred one fails at once ("database is locked", no waiting) when another process
            # committed between its read and its write
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE) else "BEGIN")
    if migrate:
        upgrade(engine)
    return engine


def writer(engine: Engine) -> Engine:
    """The engine for write transactions (BEGIN IMMEDIATE on SQLite; nothing changes elsewhere)."""
    return engine.execution_options(**{WRITE: True})


_MIGRATING = threading.Lock()  # Alembic's context is module state: one migration per process at a time


def upgrade(engine: Engine) -> None:
    """Bring the schema to the latest Alembic revision (idempotent; threads of one process, a
    worker's reaper and its webhook sender, take turns)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with _MIGRATING, engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
