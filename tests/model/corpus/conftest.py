import pytest

from model import shipped
from model.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tok() -> Tokenizer:
    """The shipped model's tokenizer (test_mixture checks that the corpora reproduce it)."""
    return Tokenizer.from_file(shipped.SHIPPED / "tokenizer.json")
