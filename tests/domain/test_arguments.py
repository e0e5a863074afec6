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
    {"type": "object", "properties": {"to": {"type": "integer"}}},  # nothing required: no call a question asks for
    {"type": "object", "required": ["q"], "properties": {"q": {"type": "string"}, "tags": {"type": "array"}}},
    {"type": "object", "required": ["q"], "properties": {"q": {"type": "array", "items": {"type": "object"}}}},
    {"type": "object", "required": ["e"], "properties": {"e": {"type": "object", "properties": {"a": {"type": "string"}}}}},
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


# functions of numbers and booleans only, and of arrays (issue 51): the model writes the text of a
# required value ("10", "true", "Paris, Rome"), read back as that value
FIB: dict[str, Any] = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "minimum": 0}}}
VOLUME: dict[str, Any] = {"type": "object", "required": ["level"], "properties": {
    "level": {"type": "integer", "minimum": 0, "maximum": 10}}}
LIGHTS: dict[str, Any] = {"type": "object", "required": ["on"], "properties": {"on": {"type": "boolean"}}}
DARK: dict[str, Any] = {"type": "object", "required": ["enabled"], "properties": {"enabled": {"type": "boolean"}}}
CITIES: dict[str, Any] = {"type": "object", "required": ["cities"], "properties": {
    "cities": {"type": "array", "items": {"type": "string"}, "minItems": 2}}}
MEAN: dict[str, Any] = {"type": "object", "required": ["values"], "properties": {
    "values": {"type": "array", "items": {"type": "number"}}}}
KPIS: dict[str, Any] = {"type": "object", "required": ["metrics", "region"], "properties": {
    "region": {"type": "string"}, "metrics": {"type": "array", "items": {"type": "string", "enum": ["revenue", "churn"]}}}}


@pytest.mark.parametrize("parameters, function, question, key, value", [
    (FIB, "get_fibonacci", "What is the 10th Fibonacci number?", "n", 10),  # an ordinal before the function's noun
    (VOLUME, "set_volume", "Set the volume to 7.", "level", 7),  # `level` says no more than "a number"
    (VOLUME, "set_volume", "Turn the volume up to 3 please", "level", 3),
    (VOLUME, "set_volume", "Volume level 0", "level", 0),  # beside its own name
    ({"type": "object", "required": ["x"], "properties": {"x": {"type": "number"}}}, "square_root",
     "What is the square root of 2.25?", "x", 2.25),
    (LIGHTS, "toggle_lights", "Turn the lights on", "on", True),
    (LIGHTS, "toggle_lights", "Please switch the lights off.", "on", False),
    (DARK, "set_dark_mode", "Enable dark mode.", "enabled", True),
    (CITIES, "compare_cities", "Compare Paris and Rome", "cities", ["Paris", "Rome"]),  # "Compare" opens it: no name
    (CITIES, "compare_cities", "Compare Lisbon, Madrid and Porto.", "cities", ["Lisbon", "Madrid", "Porto"]),
    (MEAN, "average", "What is the average of 3, 7 and 12?", "values", [3, 7, 12]),
])
def test_a_required_value_that_is_no_string_is_the_text_the_model_writes_read_back_as_that_value(
        parameters: dict[str, Any], function: str, question: str, key: str, value: Any) -> None:
    assert fits(parameters)
    b = bind(parameters, question, function)
    assert b.missing == () and b.key == key and len(b.choices) == 1, b
    assert b.arguments(b.choices[0], parameters["properties"]) == {key: value}


def test_an_array_of_enum_values_takes_those_the_question_writes_in_its_order() -> None:
    b = bind(KPIS, "Show churn and revenue for EMEA", "kpi_report")
    assert b == Binding({"metrics": ["churn", "revenue"]}, "region", ("EMEA",))


@pytest.mark.parametrize("parameters, function, question, why", [
    (FIB, "get_fibonacci", "What is a Fibonacci number?", "n: the question writes no number beside its name"),
    (FIB, "get_fibonacci", "Give me 3 Fibonacci numbers.", "n: the question writes no number"),  # a count, no index
    (VOLUME, "set_volume", "Turn the volume up by 3", "level: the question writes no number"),  # a change, no level
    (FIB, "get_fibonacci", "What is the sum of the 3rd and 10th Fibonacci numbers?",
     "n: the question writes numbers other than its own"),
    (VOLUME, "set_volume", "Set the volume to 12.", "level: the question's 12 does not fit its schema"),
    (FORECAST, "get_forecast", "Will it rain in Oslo for my 3 guests?", "days: the question writes no number"),
    (LIGHTS, "toggle_lights", "Are the lights on?", "on: the question does not write on true or false"),
    (LIGHTS, "toggle_lights", "Don't turn the lights on.", "on: the question says not to"),
    (LIGHTS, "toggle_lights", "Turn the lights on, then off.", "on: the question asks on both true and false"),
    (CITIES, "compare_cities", "Compare Paris", "cities: the question's list (Paris) does not fit its schema"),
    (CITIES, "compare_cities", "Compare Paris with Rome in July",
     "cities: the question's names ('Paris', 'Rome', 'July') make no one list"),
    (MEAN, "average", "Average my 3 scores 80, 90 and 70", "values: the question's numbers (3, 80, 90, 70) make no one list"),
    ({"type": "object", "required": ["city", "stops"], "properties": {
        "city": {"type": "string"}, "stops": {"type": "array", "items": {"type": "string"}}}}, "route",
     "Route from Paris via Lyon and Dijon", "city, stops: the question's names cannot be told apart"),
])
def test_a_value_of_no_string_that_the_question_does_not_give_unambiguously_is_why_not(
        parameters: dict[str, Any], function: str, question: str, why: str) -> None:
    b = bind(parameters, question, function)
    assert b.key is None and any(m.startswith(why) for m in b.missing), b.missing


def test_a_number_named_after_its_function_is_never_a_count_of_it() -> None:
    """find_flights' max_stops is no generic number: "2 flights" counts flights, no stops."""
    b = bind(FLIGHTS, "Find 2 flights from SFO to Berlin on 2027-01-15.", "find_flights")
    assert b.missing == () and "max_stops" not in b.values
