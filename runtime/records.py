"""The durable records (SQLAlchemy 2.0): sessions and their turns.

A turn keeps what a user was given (its text and token ids) and the commit-order ledger needed
to rebuild the session's KV cache exactly: the (position, token) pairs in the order their K/V
entered the cache (prompt prefills, then each committed set, by position inside a set).  The
cache of a session is the concatenation of its turns' ledgers; recomputing it is one causal
prefill of that ledger (model/decode.py's invariant I5).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def _now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class SessionRecord(Base):
    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    model_fingerprint: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now, onupdate=_now)
    turns: Mapped[list[TurnRecord]] = relationship(back_populates="session", order_by="TurnRecord.index")


class TurnRecord(Base):
    __tablename__ = "turns"
    __table_args__ = (UniqueConstraint("session_id", "index", name="uq_turn_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)  # 0, 1, ... within the session
    role: Mapped[str] = mapped_column(String(16))  # "user", "assistant", "tool"
    text: Mapped[str] = mapped_column(Text)
    token_ids: Mapped[list[int]] = mapped_column(JSON)
    ledger: Mapped[list[list[int]]] = mapped_column(JSON)  # [[position, token], ...] in commit order
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # decode params, path taken, costs
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    session: Mapped[SessionRecord] = relationship(back_populates="turns")
