import pytest

from model.transformer import SetDLM
from tests.fakes import random_model


@pytest.fixture(scope="module")
def model() -> SetDLM:
    return random_model(0)
