"""runtime/db.py and records.py on a real database: a SQLite file, and PostgreSQL where one
answers (the `db_engine` fixture, tests/runtime/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, inspect

from runtime.db import Records, make_engine, upgrade
from runtime.errors import BadInput, NotFound, StaleWrite
from runtime.settings import Settings

def test_migrations_create_the_tables_and_are_idempotent(db_engine: Engine) -> None:
    upgrade(db_engine)  # again: nothing to do
    names = set(inspect(db_engine).get_table_names())
    assert {"sessions", "turns", "alembic_version"} <= names


def test_turns_keep_text_tokens_and_the_commit_order_ledger(db_engine: Engine) -> None:
    db = Records(db_engine)
    s = db.create_session("acme", "6cfff3ff2058a6b3")
    db.append_turn(s.id, "acme", "user", "hello", [5, 6], [(0, 2), (1, 5), (2, 6)])
    db.append_turn(s.id, "acme", "assistant", "hi", [7, 8, 3], [(3, 7), (5, 3), (4, 8)], meta={"path": "warm"})
    turns = db.turns(s.id, "acme")
    assert db.turn_count(s.id, "acme") == 2
    assert [(t.index, t.role, t.text, t.token_ids) for t in turns] == [(0, "user", "hello", [5, 6]),
                                                                     (1, "assistant", "hi", [7, 8, 3])]
    assert turns[1].meta == {"path": "warm"}
    assert db.ledger(s.id, "acme") == [(0, 2), (1, 5), (2, 6), (3, 7), (5, 3), (4, 8)]  # commit order kept


def test_unknown_session_wrong_tenant_and_bad_input_change_nothing(db_engine: Engine) -> None:
    db = Records(db_engine)
    s = db.create_session("acme", "fp")
    with pytest.raises(NotFound):
        db.get_session("nope", "acme")
    with pytest.raises(NotFound):  # another tenant's session looks exactly like an unknown one
        db.append_turn(s.id, "globex", "user", "x", [1], [(0, 1)])
    with pytest.raises(BadInput, match="role"):
        db.append_turn(s.id, "acme", "system", "x", [1], [(0, 1)])
    with pytest.raises(BadInput, match="tenant"):
        db.create_session("", "fp")
    with pytest.raises(BadInput, match="session id"):
        db.create_session("acme", "fp", session_id="x" * 65)
    with pytest.raises(BadInput, match="exists already"):
        db.create_session("acme", "fp", session_id=s.id)
    with pytest.raises(StaleWrite, match="turn 3 expected"):  # a writer that read another turn count
        db.append_turn(s.id, "acme", "user", "x", [1], [(0, 1)], index=3)
    assert db.turns(s.id, "acme") == []


def test_the_default_database_is_a_sqlite_file_under_the_data_dir(tmp_path: Path) -> None:
    e = make_engine(Settings(data_dir=tmp_path / "data"))
    assert e.dialect.name == "sqlite" and (tmp_path / "data" / "setflow.db").exists()
    e.dispose()
