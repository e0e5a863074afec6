"""domain/arguments.py: a function's arguments filled from its question, each from what the question
writes for it, or the function is not called and says why (never a value made up).  The questions
here are written for these tests: no training template writes them."""

from __future__ import annotations

from typing import Any

import pytest

from domain.arguments import Binding, bind, fits

WEATHER: dict[str, Any] = {"type": "object", "required": ["city", "unit"], "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}}
FORECAST: dict[str, Any] = {"type": "object", "required": ["city", "days"], "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "alerts": {"type": "boolean"}, "lang": {"type": "string"}}}
FLIGHTS: dict[str, Any] = {"type": "object", "required": ["origin", "destination", "date"], "properties": {
    "origin": {"type": "string", "pattern": "^[A-Z]{3}$"}, "destination": {"type": "string"},
    "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}, "max_stops": {"type": "integer"}}}
PAIR: dict[str, Any] = {"type": "object", "required": ["a", "b"], "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}
TRIP: dict[str, Any] = {"type": "object", "required": ["city"], "properties": {
    "city": {"type": "string"}, "check_in": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}}
PRICE: dict[str, Any] = {"type": "object", "required": ["ticker", "scale"], "properties": {
    "ticker": {"type": "string"}, "scale": {"type": "number"}}}


@pytest.mark.parametrize("parameters, question, values, key, choices", [
    (WEATHER, "What's the weather in Paris in °F?", {"unit": "f"}, "city", ("Paris",)),
    (WEATHER, "Weather for San Francisco, in C please.", {"unit": "c"}, "city", ("San Francisco",)),
    (FORECAST, "Will it rain in Oslo over the next 3 days?", {"days": 3}, "city", ("Oslo",)),
    (FORECAST, "Forecast for Oslo, days=5, alerts=true", {"days": 5, "alerts": True}, "city", ("Oslo",)),
    (FORECAST, "Forecast for Oslo in 2 days, alerts: false", {"days": 2, "alerts": False}, "city", ("Oslo",)),
    # two free strings told apart by their schemas: the one left is the model's choice
    (FLIGHTS, "Find flights from SFO to Berlin on 2027-01-15.", {"destination": "Berlin", "date": "2027-01-15"},
     "origin", ("SFO",)),
    (FLIGHTS, "Any flights from SFO to Rome on 2027-01-15 with 1 max stops?",
     {"destination": "Rome", "date": "2027-01-15", "max_stops": 1}, "origin", ("SFO",)),
    (PRICE, "Price of ACME at scale 2.5?", {"scale": 2.5}, "ticker", ("ACME",)),
    # an optional string filled where its pattern fits one name alone, else left out
    (TRIP, "Hotels in Lisbon from 2027-03-02?", {"check_in": "2027-03-02"}, "city", ("Lisbon",)),
    (TRIP, "Hotels in Lisbon, any day?", {}, "city", ("Lisbon",)),
    # no free string: the model writes the enum's value
    ({"type": "object", "required": ["unit"], "properties": {"unit": {"type": "string", "enum": ["celsius", "kelvin"]}}},
     "Convert the reading to Kelvin.", {}, "unit", ("kelvin",)),
])
def test_a_question_that_gives_every_required_value_binds_them(
        parameters: dict[str, Any], question: str, values: dict[str, Any], key: str, choices: tuple[str, ...]) -> None:
    assert fits(parameters)
    assert bind(parameters, question) == Binding(values, key, choices)


@pytest.mark.parametrize("parameters, question, why", [
    (WEATHER, "What's the weather in Paris?", "unit: the question writes none of its values ('c', 'f')"),
    (WEATHER, "What's the weather in Paris in C or F?", "unit: the question writes 2 of its values"),
    (WEATHER, "Is it a cold day in Paris?", "unit: the question writes none"),  # "a" is a word, not a value
    (WEATHER, "What's the weather in °F?", "city: the question writes no name that fits it"),
    (FORECAST, "Will it rain in Oslo for my 3 guests?", "days: the question writes no number beside its name"),
    (FORECAST, "Will it rain in Oslo in 30 days?", "days: the question's 30 does not fit its schema"),
    (FORECAST, "Will it rain in Oslo in 1.5 days?", "days: the question's 1.5 is no integer"),
    (FORECAST, "Forecast for Oslo, 3 days or 4 days?", "days: the question writes 2 numbers for it"),
    (PAIR, "Compare Paris and Berlin.", "a, b: the question's names cannot be told apart"),
    # two names fit the one free string: the model would guess which, a call about the other
    (FLIGHTS, "Any flights from SFO to Rome or Milan on 2027-01-15?",
     "destination: the question writes 2 names that fit it ('Rome', 'Milan'): which one cannot be told"),
    (WEATHER, "Is it cold in Oslo for Ann, in C?", "city: the question writes 2 names"),
    (FLIGHTS, "Find flights from Berlin to Rome on 2027-01-15.", "origin: the question writes no name that fits it"),
    (FORECAST, "What is 3 + 4 days in Oslo?", "city: the question writes no name"),  # arithmetic: no name is read
])
def test_a_question_that_does_not_give_a_required_value_says_which_and_binds_nothing(
        parameters: dict[str, Any], question: str, why: str) -> None:
    b = bind(parameters, question)
    assert b.key is None and b.choices == () and any(m.startswith(why) for m in b.missing), b.missing


def test_an_optional_parameter_the_question_does_not_give_is_left_out() -> None:
    b = bind(FORECAST, "Will it rain in Oslo over the next 3 days?")
    assert "alerts" not in b.values and "lang" not in b.values  # never a default made up
    assert b.arguments("Oslo", FORECAST["properties"]) == {"city": "Oslo", "days": 3}


@pytest.mark.parametrize("parameters", [
    {"type": "object", "properties": {"to": {"type": "integer"}}},  # no required string: nothing the model writes
    {"type": "object", "required": ["n"], "properties": {"n": {"type": "number"}}},
    {"type": "object", "required": ["q"], "properties": {"q": {"type": "string"}, "tags": {"type": "array"}}},
    {"type": "object", "required": ["a"], "properties": {k: {"type": "string"} for k in "abcde"}},  # 5 parameters
    {"type": "object", "required": ["a"], "properties": {"a": {"type": "string", "enum": [1, 2]}}},
    {"type": "array"},
])
def test_parameters_that_cannot_be_filled_so_do_not_fit(parameters: dict[str, Any]) -> None:
    assert not fits(parameters)


def test_a_question_of_many_names_is_bounded_before_any_work() -> None:
    """Four free strings over a question of 40 names: 40^4 ways would be tried; refused at once."""
    four = {"type": "object", "required": list("abcd"), "properties": {k: {"type": "string"} for k in "abcd"}}
    question = "Compare " + ", ".join(f"City{i:02d}" for i in range(40)) + "."
    b = bind(four, question)
    assert b.key is None and b.missing == ("a, b, c, d: the question writes too many names that fit them to tell",)
