"""runtime/db.py (engine, migrations) and runtime/sessions/records.py on a real database: a SQLite file, and PostgreSQL where one
answers (the `db_engine` fixture, tests/runtime/conftest.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect, text

from runtime.db import MIGRATIONS, make_engine, upgrade
from runtime.errors import BadInput, Busy, NotFound, StaleWrite
from runtime.jobs.rows import Jobs
from runtime.sessions.records import JobStep, Records
from runtime.settings import Settings
from runtime.tables import Base
from tests.conftest import pg_schema


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


def _rows(db_engine: Engine, table: str, session_id: str) -> int:
    """Rows of `table` that name the session, counted in SQL (not through the ORM)."""
    with db_engine.connect() as c:
        n = c.execute(text(f"SELECT count(*) FROM {table} WHERE session_id = :s"), {"s": session_id})
        return int(n.scalar_one())


def _rows_of(db: Records, sid: str) -> list[tuple[object, ...]]:
    return [(t.index, t.role, t.text, t.token_ids, t.ledger, t.meta, t.job_id, t.job_step)
            for t in db.turns(sid, "acme")]


def _three_turns(db: Records, jobs: Jobs, tenant: str = "acme") -> str:
    s = db.create_session(tenant, "6cfff3ff2058a6b3")
    job, _ = jobs.create("turn", tenant, {"text": "hi"}, s.id)
    owner = jobs.claim(job.id, "w1").owner or ""
    db.append_turn(s.id, tenant, "user", "t0", [5, 6], [(0, 2), (1, 5), (2, 6)], meta={"rng": None}, index=0,
                   job=JobStep(job.id, 0, owner))
    db.append_turn(s.id, tenant, "assistant", "t1", [7, 8], [(3, 7), (4, 8)], meta={"path": "warm", "infill": [1]},
                   job=JobStep(job.id, 1, owner))
    db.append_turn(s.id, tenant, "tool", "t2", [9], [(5, 9)])
    return s.id


def test_fork_copies_the_first_turns_into_a_new_session(db_engine: Engine) -> None:
    db, jobs = Records(db_engine), Jobs(db_engine, Settings())
    sid = _three_turns(db, jobs)
    before = _rows_of(db, sid)
    child = db.fork(sid, "acme", 1, new_id="child-1")
    assert (child.id, child.tenant, child.model_fingerprint) == ("child-1", "acme", "6cfff3ff2058a6b3")
    copied = db.turns("child-1", "acme")
    assert [(t.index, t.role, t.text, t.token_ids, t.ledger, t.meta) for t in copied] == [b[:6] for b in before[:2]]
    assert all(t.job_id is None and t.job_step is None for t in copied), "a job step names one turn: not copied"
    assert db.ledger("child-1", "acme") == db.ledger(sid, "acme")[:5]
    assert _rows_of(db, sid) == before, "the parent is unchanged"
    # the fork is a session of its own: it grows apart from its parent
    db.append_turn("child-1", "acme", "user", "more", [1], [(5, 1)])
    assert db.turn_count("child-1", "acme") == 3 and db.turn_count(sid, "acme") == 3
    assert db.ledger(sid, "acme")[-1] == (5, 9)
    assert len(db.fork(sid, "acme", 0).id) == 24 and db.fork(sid, "acme", 2).id != sid  # a fresh id by default


def test_a_bad_fork_is_refused_and_writes_nothing(db_engine: Engine) -> None:
    db, jobs = Records(db_engine), Jobs(db_engine, Settings())
    sid = _three_turns(db, jobs)
    with pytest.raises(NotFound):
        db.fork("nope", "acme", 0, new_id="x1")
    with pytest.raises(NotFound):  # another tenant's session looks exactly like an unknown one
        db.fork(sid, "globex", 0, new_id="x2")
    for turn in (3, -1):
        with pytest.raises(BadInput, match="cannot fork at turn"):
            db.fork(sid, "acme", turn, new_id="x3")
    with pytest.raises(BadInput, match="exists already"):
        db.fork(sid, "acme", 0, new_id=sid)
    with pytest.raises(BadInput, match="session id"):
        db.fork(sid, "acme", 0, new_id="not ok")
    for x in ("x1", "x2", "x3"):
        with pytest.raises(NotFound):
            db.get_session(x, "acme")
    with db_engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM sessions")).scalar_one() == 1
        assert c.execute(text("SELECT count(*) FROM turns")).scalar_one() == 3


def test_delete_session_deletes_its_turns_and_jobs_by_cascade(db_engine: Engine) -> None:
    db, jobs = Records(db_engine), Jobs(db_engine, Settings())
    if db_engine.dialect.name == "sqlite":  # make_engine turns it on: SQLite ignores FKs otherwise
        with db_engine.connect() as c:
            assert c.execute(text("PRAGMA foreign_keys")).scalar_one() == 1
    sid = _three_turns(db, jobs)
    other = _three_turns(db, jobs)
    fork = db.fork(sid, "acme", 1).id
    with pytest.raises(NotFound):
        db.delete_session("nope", "acme")
    with pytest.raises(NotFound):  # another tenant's: refused, nothing deleted
        db.delete_session(sid, "globex")
    assert (_rows(db_engine, "turns", sid), _rows(db_engine, "jobs", sid)) == (3, 1)
    db.delete_session(sid, "acme")
    with pytest.raises(NotFound):
        db.get_session(sid, "acme")
    assert (_rows(db_engine, "turns", sid), _rows(db_engine, "jobs", sid)) == (0, 0)
    with pytest.raises(NotFound):
        db.delete_session(sid, "acme")  # once only
    assert db.turn_count(other, "acme") == 3 and _rows(db_engine, "jobs", other) == 1, "other sessions stay"
    assert db.turn_count(fork, "acme") == 2, "a fork owns its copies"


def test_an_idle_only_delete_is_refused_while_a_job_of_the_session_is_unfinished(db_engine: Engine) -> None:
    db, jobs = Records(db_engine), Jobs(db_engine, Settings())
    sid = db.create_session("acme", "").id
    job, _ = jobs.create("turn", "acme", {"text": "x"}, sid)
    with pytest.raises(Busy):  # checked in the delete's own transaction (the API's race with a submit)
        db.delete_session(sid, "acme", idle_only=True)
    assert _rows(db_engine, "jobs", sid) == 1 and db.turn_count(sid, "acme") == 0
    jobs.cancel(job.id, "acme")
    assert db.delete_session(sid, "acme", idle_only=True) == [job.id]
    with pytest.raises(NotFound):  # a submission after the delete finds no session
        jobs.create("turn", "acme", {"text": "x"}, sid)


def test_the_migrations_make_the_tables_runtime_tables_declares(db_engine: Engine) -> None:
    """Every table, column and index of runtime/tables.py, as Alembic's autogenerate compares them."""
    with db_engine.connect() as c:
        assert compare_metadata(MigrationContext.configure(c), Base.metadata) == []


def test_migration_0009_counts_what_each_tenant_holds_already(db_engine: Engine) -> None:
    """Sessions and turns written before tenant_usage existed: the upgrade counts them, each
    turn's bytes kept with it, so that deleting one later takes out what was counted."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with db_engine.begin() as c:
        cfg.attributes["connection"] = c
        command.downgrade(cfg, "0008")
    with db_engine.begin() as c:
        c.execute(text("INSERT INTO sessions (id, tenant, model_fingerprint, model, numerics, created_at, updated_at) "
                       "VALUES ('s1', 'acme', '', '', '', :t, :t), ('s2', 'acme', '', '', '', :t, :t), "
                       "('s3', 'globex', '', '', '', :t, :t)"), {"t": datetime.now(UTC)})
        c.execute(text("INSERT INTO turns (session_id, \"index\", role, text, token_ids, ledger, meta, created_at) "
                       "VALUES ('s1', 0, 'user', 'Grüße', '[1, 2]', '[[0, 1], [1, 2]]', '{}', :t), "
                       "('s2', 0, 'user', 'hi', '[3]', '[[0, 3]]', '{\"path\": \"new\"}', :t)"), {"t": datetime.now(UTC)})
    upgrade(db_engine)
    expect = {"s1": len("Grüße".encode()) + len("[1, 2]") + len("[[0, 1], [1, 2]]") + len("{}"),
              "s2": len("hi") + len("[3]") + len("[[0, 3]]") + len('{"path": "new"}')}
    with db_engine.connect() as c:
        assert dict(c.execute(text("SELECT session_id, bytes FROM turns")).all()) == expect
        assert sorted(c.execute(text("SELECT tenant, sessions, turn_bytes FROM tenant_usage")).all()) == [
            ("acme", 2, expect["s1"] + expect["s2"]), ("globex", 1, 0)]
    Records(db_engine).delete_session("s1", "acme")
    with db_engine.connect() as c:
        assert c.execute(text("SELECT turn_bytes FROM tenant_usage WHERE tenant = 'acme'")).scalar_one() == expect["s2"]


def test_the_pool_pings_and_replaces_a_connection_the_server_closed(tmp_path: Path) -> None:
    """PostgreSQL kills a pooled connection (a restart, a proxy's idle timeout, an operator):
    the next checkout pings it, finds it dead and connects again; the caller sees nothing."""
    with pg_schema() as url:
        engine = make_engine(Settings(database_url=url, data_dir=tmp_path, database_timeout_s=3))
        try:
            with engine.connect() as c:
                pid = c.execute(text("SELECT pg_backend_pid()")).scalar_one()
                dsn = c.connection.dbapi_connection.info.dsn  # type: ignore[union-attr]
            assert "connect_timeout=3" in dsn
            admin = make_engine(Settings(database_url=url, data_dir=tmp_path), migrate=False)
            with admin.connect() as c:
                assert c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
            admin.dispose()
            with engine.connect() as c:  # the same pooled connection, dead: pinged and replaced
                assert c.execute(text("SELECT pg_backend_pid()")).scalar_one() != pid
            assert Records(engine).create_session("acme", "fp").id
        finally:
            engine.dispose()


def test_sqlite_waits_for_a_lock_as_long_as_the_setting_says(tmp_path: Path) -> None:
    engine = make_engine(Settings(data_dir=tmp_path, database_timeout_s=2.5))
    with engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA busy_timeout").scalar_one() == 2500
    assert engine.pool._pre_ping  # type: ignore[attr-defined]
    engine.dispose()


def test_a_new_data_dir_and_database_are_private_and_errors_hide_their_values(tmp_path: Path) -> None:
    import stat

    from sqlalchemy.exc import DBAPIError
    e = make_engine(Settings(data_dir=tmp_path / "new"))
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new" / "setflow.db").stat().st_mode) & 0o077 == 0
    with pytest.raises(DBAPIError) as err, e.connect() as c:
        c.execute(text("SELECT :secret + no_such_column"), {"secret": "whsec_s3cr3t"})
    assert "whsec_s3cr3t" not in str(err.value)
    e.dispose()
