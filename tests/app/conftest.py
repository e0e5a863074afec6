"""The client's tests run against the API's test servers (tests/runtime/api/conftest.py)."""

from tests.runtime.api.conftest import api, make_api  # noqa: F401  (fixtures)
