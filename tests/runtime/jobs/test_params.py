"""ParamsSpec is DecodeParams at the edge: one field list (names, types, defaults, bounds), both
ways through JSON, strict about what a number is."""

from __future__ import annotations

import json
from dataclasses import MISSING, fields

import pytest

from model.params import DecodeParams
from runtime.errors import BadInput
from runtime.jobs.kinds import check_spec
from runtime.jobs.params import ParamsSpec

#: a value other than the default for every field a request may set
EVERY = {"policy": "prefix", "window": 7, "tau": 0.5, "max_new_tokens": 33, "temperature": 0.7, "seed": 11,
         "stop": [[3, 4], [9]], "ignore_eos": True}


def test_the_spec_has_the_dataclass_fields_and_defaults_but_the_internal_ones() -> None:
    offered = [f for f in fields(DecodeParams) if f.metadata.get("api", True)]
    assert list(ParamsSpec.model_fields) == [f.name for f in offered]
    assert {f.name for f in fields(DecodeParams)} - set(ParamsSpec.model_fields) == {"use_cache", "guide"}
    assert ParamsSpec().model_dump() == {f.name: f.default if f.default is not MISSING else f.default_factory()
                                         for f in offered}
    assert set(EVERY) == set(ParamsSpec.model_fields)
    assert all(v != ParamsSpec.model_fields[k].get_default(call_default_factory=True) for k, v in EVERY.items())


def test_json_round_trips_cover_every_field() -> None:
    p = DecodeParams(**EVERY, use_cache=False)
    assert set(p.to_dict()) == {f.name for f in fields(DecodeParams)} - {"guide"}  # the guide is an object
    assert DecodeParams(**json.loads(json.dumps(p.to_dict()))) == p
    spec = ParamsSpec.model_validate(json.loads(json.dumps(EVERY)))
    back = DecodeParams(**spec.model_dump())  # as the worker builds it
    assert back == DecodeParams(**EVERY) and back.to_dict() == {**EVERY, "use_cache": True}
    assert ParamsSpec.model_validate(json.loads(spec.model_dump_json())) == spec


@pytest.mark.parametrize("params", [{"window": "4"}, {"window": 4.0}, {"window": True}, {"tau": "0.5"},
                                    {"max_new_tokens": "64"}, {"temperature": "1"}, {"seed": "3"},
                                    {"stop": [["1"]]}, {"ignore_eos": 1}, {"ignore_eos": "true"}])
def test_a_number_is_a_json_number_and_a_flag_a_boolean(params: dict[str, object]) -> None:
    with pytest.raises(BadInput, match=rf"bad turn spec: params\.{next(iter(params))}\b") as e:
        check_spec("turn", {"text": "hi", "params": params}, "s")
    assert e.value.code == "bad_input"


@pytest.mark.parametrize("params", [{"window": 0}, {"window": 257}, {"tau": 1.5}, {"max_new_tokens": 4097},
                                    {"temperature": -0.1}, {"seed": 2**63}, {"stop": [[]]}, {"stop": [[1]] * 17},
                                    {"stop": [[2**24]]}, {"policy": "greedy"}, {"use_cache": False}])
def test_the_bounds_and_the_internal_fields_are_refused(params: dict[str, object]) -> None:
    with pytest.raises(BadInput, match=rf"params\.{next(iter(params))}"):
        check_spec("turn", {"text": "hi", "params": params}, "s")


def test_an_integer_is_a_number_and_a_workflow_keeps_its_defaults() -> None:
    spec = check_spec("narrative", {"payload": {"tenant": "a", "period": "Q1", "metrics": [
        {"key": "revenue", "value": 1, "prev": 2}]}, "params": {"tau": 1, "temperature": 0}}, "s")
    assert spec.params.tau == 1.0 and isinstance(spec.params.tau, float)  # type: ignore[attr-defined]
    assert (spec.params.policy, spec.params.window) == ("prefix", 8)  # type: ignore[attr-defined]
