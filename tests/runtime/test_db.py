"""runtime/db.py and records.py on a real database: a SQLite file, and PostgreSQL where one
answers on 127.0.0.1:5432 (database `test`; each run in its own schema, dropped afterwards)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine, create_engine, inspect

from runtime.db import Records, make_engine, upgrade
from runtime.errors import BadInput, NotFound
from runtime.settings import Settings

PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _pg_engine() -> Iterator[Engine]:
    try:
        admin = create_engine(PG, connect_args={"connect_timeout": 2})
        with admin.connect():
            pass
    except Exception as e:  # noqa: BLE001 - any failure to reach it: no PostgreSQL here
        pytest.skip(f"no PostgreSQL at {PG}: {type(e).__name__}")
    schema = f"sftest_{uuid.uuid4().hex[:10]}"
    with admin.begin() as c:
        c.execute(sa.text(f"CREATE SCHEMA {schema}"))
    engine = create_engine(PG, connect_args={"options": f"-csearch_path={schema}"})
    try:
        upgrade(engine)
        yield engine
    finally:
        engine.dispose()
        with admin.begin() as c:
            c.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        e = make_engine(Settings(data_dir=tmp_path))
        yield e
        e.dispose()
    else:
        yield from _pg_engine()


def test_migrations_create_the_tables_and_are_idempotent(engine: Engine) -> None:
    upgrade(engine)  # again: nothing to do
    names = set(inspect(engine).get_table_names())
    assert {"sessions", "turns", "alembic_version"} <= names


def test_turns_keep_text_tokens_and_the_commit_order_ledger(engine: Engine) -> None:
    db = Records(engine)
    s = db.create_session("acme", "6cfff3ff2058a6b3")
    db.append_turn(s.id, "acme", "user", "hello", [5, 6], [(0, 2), (1, 5), (2, 6)])
    db.append_turn(s.id, "acme", "assistant", "hi", [7, 8, 3], [(3, 7), (5, 3), (4, 8)], meta={"path": "warm"})
    turns = db.turns(s.id, "acme")
    assert db.turn_count(s.id, "acme") == 2
    assert [(t.index, t.role, t.text, t.token_ids) for t in turns] == [(0, "user", "hello", [5, 6]),
                                                                     (1, "assistant", "hi", [7, 8, 3])]
    assert turns[1].meta == {"path": "warm"}
    assert db.ledger(s.id, "acme") == [(0, 2), (1, 5), (2, 6), (3, 7), (5, 3), (4, 8)]  # commit order kept


def test_unknown_session_wrong_tenant_and_bad_input_change_nothing(engine: Engine) -> None:
    db = Records(engine)
    s = db.create_session("acme", "fp")
    with pytest.raises(NotFound):
        db.get_session("nope", "acme")
    with pytest.raises(NotFound):  # another tenant's session looks exactly like an unknown one
        db.append_turn(s.id, "globex", "user", "x", [1], [(0, 1)])
    with pytest.raises(BadInput, match="role"):
        db.append_turn(s.id, "acme", "system", "x", [1], [(0, 1)])
    with pytest.raises(BadInput, match="tenant"):
        db.create_session("", "fp")
    assert db.turns(s.id, "acme") == []


def test_the_default_database_is_a_sqlite_file_under_the_data_dir(tmp_path: Path) -> None:
    e = make_engine(Settings(data_dir=tmp_path / "data"))
    assert e.dialect.name == "sqlite" and (tmp_path / "data" / "setflow.db").exists()
    e.dispose()
