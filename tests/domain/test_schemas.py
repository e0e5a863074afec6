"""A tenant's JSON Schema is data: it fetches nothing, its patterns run in linear time, and its
size and depth are capped at submission (domain/schemas.py, through the function tool's spec)."""

from __future__ import annotations

import socket
import threading

import pytest

from domain import schemas
from runtime.jobs.kinds import FunctionTool


@pytest.fixture
def listener():
    """A loopback TCP port that counts the connections made to it (and answers nothing)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    hits: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            hits.append(1)
            c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], hits
    stop.set()
    t.join()
    srv.close()


def tool(parameters: dict) -> FunctionTool:
    return FunctionTool(name="f", parameters=parameters)


@pytest.mark.parametrize("ref", ["http://127.0.0.1:{port}/x.json", "file:///etc/passwd", "other.json#/a",
                                 "//127.0.0.1:{port}/x", "urn:x:y"])
@pytest.mark.parametrize("keyword", ["$ref", "$dynamicRef"])
def test_a_reference_outside_the_document_is_refused_and_nothing_is_fetched(listener, ref, keyword):
    port, hits = listener
    schema = {"type": "object", "properties": {"a": {keyword: ref.format(port=port)}}}
    with pytest.raises(ValueError, match="points outside the document"):
        tool(schema)
    assert schemas.problems({"allOf": [{keyword: ref.format(port=port)}]})
    # the validator of a schema taken by other means resolves nothing outside it either
    errors = []
    try:
        errors = list(schemas.validator(schema).iter_errors({"a": "x"}))
    except Exception as e:  # noqa: BLE001 - an unresolvable reference raises: what matters is no fetch
        errors = [e]
    assert errors and hits == []


def test_an_id_is_refused_and_a_remote_schema_keyword_fetches_nothing(listener):
    port, hits = listener
    assert "$id" in schemas.problems({"$id": f"http://127.0.0.1:{port}/", "type": "object"})
    assert "$id" in schemas.problems({"properties": {"a": {"$id": f"http://127.0.0.1:{port}/a", "$ref": "#"}}})
    odd = {"type": "object", "properties": {"a": {"$schema": f"http://127.0.0.1:{port}/s", "type": "string"}}}
    f = tool(odd)
    assert f.problem({"a": "x"}) is None and f.problem({"a": 1}) is not None
    assert hits == []


def test_local_references_still_work():
    f = tool({"type": "object", "$defs": {"r": {"type": "string", "enum": ["EMEA", "APAC"]}},
              "properties": {"region": {"$ref": "#/$defs/r"}}, "required": ["region"]})
    assert f.problem({"region": "EMEA"}) is None
    assert "is not one of" in (f.problem({"region": "Mars"}) or "")


EVIL = "^(.?){40}(.?){40}Z$"  # exponential under a backtracking engine: hours for 40 characters


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["pattern", "patternProperties", "propertyNames", "additionalProperties"])
def test_a_pattern_runs_in_linear_time(where):
    """Each way a schema runs a regular expression over the model's arguments goes through RE2:
    the pattern that backtracks for hours under Python's re answers at once (the test would time
    out otherwise)."""
    s = "a" * 40
    schema, bad, good = {
        "pattern": ({"type": "object", "properties": {"a": {"type": "string", "pattern": EVIL}}}, {"a": s}, {"a": "Z"}),
        "patternProperties": ({"type": "object", "patternProperties": {EVIL: {"type": "integer"}}}, {"Z": s, s: 1}, {"Z": 1, s: "x"}),
        "propertyNames": ({"type": "object", "propertyNames": {"pattern": EVIL}}, {s: 1}, {"Z": 1}),
        "additionalProperties": ({"type": "object", "patternProperties": {EVIL: {}}, "additionalProperties": False},
                                 {s: 1}, {"Z": 1}),
    }[where]
    f = tool(schema)
    assert f.problem(bad) is not None
    assert f.problem(good) is None


def test_a_pattern_re2_cannot_run_is_refused_with_the_reason():
    for p in [r"(a)\1", r"(?=a)b", r"(?<!a)b"]:
        with pytest.raises(ValueError, match="RE2 syntax"):
            tool({"type": "object", "properties": {"a": {"type": "string", "pattern": p}}})
    with pytest.raises(ValueError, match="at most 1000"):
        tool({"type": "object", "properties": {"a": {"type": "string", "pattern": "a" * 1001}}})
    assert "unevaluatedProperties" in schemas.problems(
        {"patternProperties": {"a": {}}, "unevaluatedProperties": False})


def test_a_schema_is_capped_in_depth_and_size():
    deep: dict = {"type": "string"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ValueError, match="deeper than 32"):
        tool(deep)
    deep_list: list = []
    for _ in range(5000):
        deep_list = [deep_list]
    assert "deeper" in schemas.problems({"enum": deep_list})
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(1000)}}
    with pytest.raises(ValueError, match="bytes as JSON; at most 65536"):
        tool(big)


def test_data_that_looks_like_a_keyword_is_data():
    """enum, const, default and examples hold data: a '$ref' or 'pattern' there is not followed."""
    f = tool({"type": "object", "properties": {"a": {"const": {"$ref": "http://x/", "pattern": "(a)\\1"}}}})
    assert f.problem({"a": {"$ref": "http://x/", "pattern": "(a)\\1"}}) is None
