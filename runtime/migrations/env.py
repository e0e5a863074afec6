"""Alembic environment: runs on the connection runtime/db.py passes in (no alembic.ini)."""

from __future__ import annotations

from alembic import context

from runtime.tables import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
