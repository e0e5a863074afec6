"""Client functions of several parameters (issue 51): the shipped model, through the Responses
API's workflow (workflows/responses.py) on a new session in this process, asked questions whose
functions and phrasings no training template writes (weather, forecasts, quotes, flights, users;
domain/arguments.py fills all arguments but the one the model writes).  Each question either gives
every required value (the call is right when its arguments are exactly the listed ones; its
output, words or a number, is then sent and the answer is right when it comes back verified and
quotes it) or does not (right when no call is made and the response fails saying so).

A wrong success is a call with other arguments, a call where none should be made, or a verified
answer that does not state the output.  Prints one line per question, then one JSON line
{"bench": "functions", ...}.

    python bench/functions.py [--threads N] [--only SUBSTRING] [--set all|issue51|held_out]

HELD_OUT (reported apart) are functions of numbers and booleans only, and of arrays, with an
object one that is never filled: schemas and phrasings no training template and none of CASES
writes.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from model import shipped
from runtime.errors import NoAnswer, Unverified
from runtime.jobs.kinds import ResponseSpec
from runtime.sessions.local import LocalTurns
from workflows import responses


def fn(name: str, required: list[str], **props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object", "required": required, "properties": props}}


S: dict[str, Any] = {"type": "string"}
WEATHER = fn("get_weather", ["city", "unit"], city=S, unit={"type": "string", "enum": ["c", "f"]})
WEATHER_WORDS = fn("current_weather", ["location", "scale"], location=S,
                   scale={"type": "string", "enum": ["celsius", "fahrenheit"]})
FORECAST = fn("get_forecast", ["city", "days"], city=S, days={"type": "integer", "minimum": 1, "maximum": 14},
              alerts={"type": "boolean"})
QUOTE = fn("get_quote", ["symbol"], symbol={"type": "string", "pattern": "^[A-Z]{1,5}$"},
           exchange={"type": "string", "enum": ["NYSE", "NASDAQ"]})
USER = fn("lookup_user", ["email"], email={"type": "string", "pattern": "^[^@ ]+@[^@ ]+$"},
          include_orders={"type": "boolean"})
FLIGHTS = fn("find_flights", ["origin", "destination"], origin={"type": "string", "pattern": "^[A-Z]{3}$"},
             destination=S, date={"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
             max_stops={"type": "integer", "minimum": 0})
CONVERT = fn("convert", ["amount", "source", "target"], amount={"type": "number"},
             source={"type": "string", "enum": ["USD", "EUR", "GBP"]},
             target={"type": "string", "enum": ["USD", "EUR", "GBP"]})
COMPARE = fn("compare_cities", ["first", "second"], first=S, second=S)
METRIC = fn("get_metric", ["metric", "region", "period"], metric=S, region=S, period=S,
            decimals={"type": "integer", "minimum": 0, "maximum": 4})

# issue 51's second part: functions of numbers and booleans only, arrays (schemas and phrasings
# that neither training nor the cases above drew: reported apart, as "held_out")
FIB = fn("get_fibonacci", ["n"], n={"type": "integer", "minimum": 0, "maximum": 90})
VOLUME = fn("set_volume", ["level"], level={"type": "integer", "minimum": 0, "maximum": 10})
LIGHTS = fn("toggle_lights", ["on"], on={"type": "boolean"})
DARK = fn("set_dark_mode", ["enabled"], enabled={"type": "boolean"})
TIMER = fn("start_timer", ["minutes"], minutes={"type": "integer", "minimum": 1}, label=S)
ROOT = fn("square_root", ["x"], x={"type": "number", "minimum": 0})
CITIES = fn("compare_cities", ["cities"], cities={"type": "array", "items": {"type": "string"}, "minItems": 2})
MEAN = fn("average", ["values"], values={"type": "array", "items": {"type": "number"}, "minItems": 1})
KPIS = fn("kpi_report", ["metrics", "region"], region=S,
          metrics={"type": "array", "items": {"type": "string", "enum": ["revenue", "churn", "margin"]}})
EVENT = fn("create_event", ["event"], event={"type": "object", "properties": {"title": S, "city": S}})

#: (function, question, the arguments it gives, or None: it does not give every required one; output)
CASES: list[tuple[dict[str, Any], str, dict[str, Any] | None, str]] = [
    (WEATHER, "What's the weather in Paris in °F?", {"city": "Paris", "unit": "f"}, "72 and sunny"),
    (WEATHER, "How warm is it in Lisbon right now, in C?", {"city": "Lisbon", "unit": "c"}, "21"),
    (WEATHER, "Tell me the current temperature in New York in F.", {"city": "New York", "unit": "f"}, "44"),
    (WEATHER, "Is it cold in Oslo today? Answer in °C.", {"city": "Oslo", "unit": "c"}, "-3 and windy"),
    (WEATHER, "What's the weather in Paris?", None, ""),
    (WEATHER, "Weather in Rome, C or F, whichever.", None, ""),
    (WEATHER_WORDS, "Current conditions in Berlin in Celsius?", {"location": "Berlin", "scale": "celsius"}, "cloudy"),
    (WEATHER_WORDS, "How hot is Madrid in fahrenheit?", {"location": "Madrid", "scale": "fahrenheit"}, "98"),
    (FORECAST, "Will it rain in Oslo over the next 3 days?", {"city": "Oslo", "days": 3}, "rain, then snow"),
    (FORECAST, "Give me the 5 day forecast for Denver.", {"city": "Denver", "days": 5}, "dry and mild"),
    (FORECAST, "Forecast for Tokyo, days=7, alerts=true", {"city": "Tokyo", "days": 7, "alerts": True}, "typhoon warning"),
    (FORECAST, "Forecast for Tokyo in 20 days", None, ""),
    (FORECAST, "What's the forecast for Cairo?", None, ""),
    (QUOTE, "What's the price of MSFT on NASDAQ?", {"symbol": "MSFT", "exchange": "NASDAQ"}, "412.3"),
    (QUOTE, "Quote for AAPL please", {"symbol": "AAPL"}, "189.5"),
    (USER, "Look up bob@example.org with include_orders=false", {"email": "bob@example.org", "include_orders": False},
     "Bob Ray, customer since 2021"),
    (FLIGHTS, "Find flights from SFO to Berlin on 2027-01-15.",
     {"origin": "SFO", "destination": "Berlin", "date": "2027-01-15"}, "3 flights, from 412 USD"),
    (FLIGHTS, "Any flights from JFK to Rome with 0 max stops?", {"origin": "JFK", "destination": "Rome", "max_stops": 0},
     "1 flight"),
    (FLIGHTS, "Find flights to Berlin.", None, ""),
    (CONVERT, "Convert 20 USD to EUR.", None, ""),  # which is the source cannot be told from the values alone
    (COMPARE, "Compare Paris and Berlin.", None, ""),
    (METRIC, "What was churn in APAC in 2026-Q3?", {"metric": "churn", "region": "APAC", "period": "2026-Q3"}, "2.7"),
]

HELD_OUT: list[tuple[dict[str, Any], str, dict[str, Any] | None, str]] = [
    (FIB, "What is the 10th Fibonacci number?", {"n": 10}, "55"),
    (FIB, "Give me the 20th Fibonacci.", {"n": 20}, "6765"),
    (FIB, "What is a Fibonacci number?", None, ""),
    (FIB, "What is the sum of the 3rd and 10th Fibonacci numbers?", None, ""),  # the function gives no sum
    (VOLUME, "Set the volume to 7.", {"level": 7}, "volume set"),
    (VOLUME, "Turn the volume up to 3 please", {"level": 3}, "volume set"),
    (VOLUME, "Volume level 0", {"level": 0}, "muted"),
    (VOLUME, "Turn the volume up by 3", None, ""),  # a change, not a level
    (VOLUME, "Set the volume to 12.", None, ""),  # past its maximum
    (LIGHTS, "Turn the lights on", {"on": True}, "lights are on"),
    (LIGHTS, "Please switch the lights off.", {"on": False}, "lights are off"),
    (LIGHTS, "Are the lights on?", None, ""),
    (LIGHTS, "Don't turn the lights on.", None, ""),
    (DARK, "Enable dark mode.", {"enabled": True}, "dark mode on"),
    (TIMER, "Start a timer for 15 minutes.", {"minutes": 15}, "timer started"),
    (TIMER, "Start a timer.", None, ""),
    (ROOT, "What is the square root of 2.25?", {"x": 2.25}, "1.5"),
    (CITIES, "Compare Paris and Rome", {"cities": ["Paris", "Rome"]}, "Rome is warmer"),
    (CITIES, "Compare Lisbon, Madrid and Porto.", {"cities": ["Lisbon", "Madrid", "Porto"]}, "Madrid is largest"),
    (CITIES, "Compare Paris", None, ""),  # one city: fewer than minItems
    (CITIES, "Compare Paris with Rome in July", None, ""),  # which names are the list cannot be told
    (MEAN, "What is the average of 3, 7 and 12?", {"values": [3, 7, 12]}, "7.33"),
    (MEAN, "Average my 3 scores 80, 90 and 70", None, ""),  # is 3 one of them?
    (KPIS, "Show churn and revenue for EMEA", {"metrics": ["churn", "revenue"], "region": "EMEA"}, "churn 2.7, revenue 120"),
    (EVENT, "Create an event called Launch in Paris.", None, ""),  # an object: never filled
]


def run(loaded: Any, function: dict[str, Any], question: str, want: dict[str, Any] | None, output: str) -> dict[str, Any]:
    """One question: the call (its arguments), then the answer to the output; its outcome."""
    conv = LocalTurns(*loaded)
    out: dict[str, Any] = {"question": question, "function": function["name"], "want": want}
    try:
        first = responses.run(conv, ResponseSpec.model_validate({"mode": "agent", "functions": [function], "question": question}))
    except (NoAnswer, Unverified) as e:
        out.update(outcome="refused" if want is None else "not_called", why=e.message[-160:])
        return out
    [item] = first["output"]
    if item["type"] != "function_call":
        out.update(outcome="wrong" if first.get("verified") else "not_called", text=item.get("text"))
        return out
    got = json.loads(item["arguments"])
    out["got"] = got
    if got != want:
        out["outcome"] = "wrong"
        return out
    try:
        second = responses.run(conv, ResponseSpec.model_validate(
            {"mode": "agent", "functions": [function], "parked": first["parked"], "output": output}))
    except (NoAnswer, Unverified) as e:
        out.update(outcome="called_unverified", why=e.message[-160:])
        return out
    text = second["output"][0].get("text", "")
    out["answer"] = text
    quoted = text.count(output) == 1
    out["outcome"] = "right" if second.get("verified") and quoted else "wrong" if second.get("verified") else "called_unverified"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", default=None, help="the questions that hold this text")
    ap.add_argument("--set", choices=("all", "issue51", "held_out"), default="all")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    loaded = shipped.load()
    rows, t0 = [], time.perf_counter()
    sets = {"issue51": CASES, "held_out": HELD_OUT}
    for group, cases in sets.items():
        if a.set not in ("all", group):
            continue
        for function, question, want, output in cases:
            if a.only and a.only not in question:
                continue
            t = time.perf_counter()
            r = run(loaded, function, question, want, output)
            r.update(s=round(time.perf_counter() - t, 2), set=group)
            rows.append(r)
            print(f"{r['outcome']:18} {r['s']:6.2f}s  {question}  {r.get('got', '')}  {r.get('answer') or r.get('why', '')}")
    print(json.dumps({"bench": "functions", **summary(rows), "seconds": round(time.perf_counter() - t0, 1),
                      "sets": {g: summary([r for r in rows if r["set"] == g]) for g in sets}}))


def summary(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The outcomes' counts over some rows."""
    outcomes = [r["outcome"] for r in rows]
    given = [r for r in rows if r["want"] is not None]
    return {"questions": len(rows), "given": len(given), "called_right": sum(r.get("got") == r["want"] for r in given),
            "answered_right": outcomes.count("right"), "refused_right": outcomes.count("refused"),
            "not_given": len(rows) - len(given), "wrong_successes": outcomes.count("wrong"),
            "not_called": outcomes.count("not_called"), "called_unverified": outcomes.count("called_unverified")}


if __name__ == "__main__":
    main()
