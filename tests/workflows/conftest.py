"""The shipped model, loaded once for the workflow tests, and a new in-process session."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from model import shipped
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.sessions.local import LocalTurns


@pytest.fixture(scope="session")
def loaded() -> tuple[SetDLM, Tokenizer]:
    return shipped.load()


@pytest.fixture
def session(loaded: tuple[SetDLM, Tokenizer]) -> Callable[[], LocalTurns]:
    """A new session in this process, on each call."""
    return lambda: LocalTurns(*loaded)
