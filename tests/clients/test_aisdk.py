"""The Vercel AI SDK (`ai` 6 with `@ai-sdk/openai`'s Responses provider, in Node) against a real
stack (app.demo.Stack: worker processes, Redis, SQLite): the README's agent question with a
client-run `get_metric` over a multi-step tool loop, by generateText and by streamText, then a
second question in each of the three ways a client goes on: the messages re-sent,
previousResponseId, a conversation; and a get_weather(city, unit) of two parameters, its unit
filled from the question, and get_fibonacci(n) and compare_cities(cities) of no string (issue
51).  aisdk/run.mjs drives the SDK and prints what it returned
and the request bodies it sent; this module judges them.

The packages are installed with `npm ci` from aisdk/package-lock.json into
.cache/aisdk/<hash of the package files>/ (gitignored), once: a rerun finds them there.  Where
node or npm is missing, or npm cannot reach its registry, every test here skips and says why."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.demo import Stack
from runtime.settings import Settings
from tests.runtime.api.conftest import delete_keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a first run installs the packages
HERE = Path(__file__).parent / "aisdk"
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "aisdk"
KEY = "sk-aisdk-acme-0001"
NPM_S = 600  # npm ci's time, at most
CASE_S = 300  # one case's time, at most (four responses, each a few turns on the CPU)
#: npm's words for a registry it cannot reach (its error codes, and what a proxy answers)
UNREACHABLE = re.compile(r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|"
                         r"network|proxy|socket hang up|getaddrinfo|E403|E407|E5\d\d", re.I)
FIRST = {"metric": "churn", "region": "APAC", "period": "2026-Q3"}
SECOND = {"metric": "churn", "region": "APAC", "period": "2026-Q2"}


def installed() -> Path:
    """The folder that holds aisdk's node_modules for these package files (installed now, once:
    into a folder of its own, then renamed, so a run cut short leaves nothing half-installed);
    pytest.skip where node or npm is missing or npm cannot reach its registry."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("the AI SDK test needs Node and npm: node or npm is not on PATH")
    files = ("package.json", "package-lock.json")
    digest = hashlib.sha256(b"".join((HERE / f).read_bytes() for f in files)).hexdigest()[:16]
    home = CACHE / digest
    if (home / "node_modules").is_dir():
        return home
    CACHE.mkdir(parents=True, exist_ok=True)
    part = CACHE / f"{digest}.{uuid.uuid4().hex[:8]}"
    part.mkdir()
    try:
        for f in files:
            shutil.copy(HERE / f, part / f)
        try:
            run = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=part, capture_output=True, text=True,
                                 timeout=NPM_S)
        except subprocess.TimeoutExpired:
            pytest.skip(f"npm ci did not finish in {NPM_S} s: its registry is unreachable or too slow from here")
        said = (run.stdout + run.stderr)[-2000:]
        if run.returncode != 0:
            if UNREACHABLE.search(said):
                pytest.skip(f"npm cannot reach its registry (npm ci failed): {' '.join(said.split())[:400]}")
            pytest.fail(f"npm ci failed:\n{said}")
        try:
            part.rename(home)
        except OSError:  # another run installed it meanwhile
            pass
    finally:
        shutil.rmtree(part, ignore_errors=True)
    return home


@pytest.fixture(scope="module")
def sdk_home() -> Path:
    home = installed()
    shutil.copy(HERE / "run.mjs", home / "run.mjs")  # beside its node_modules: its imports resolve there
    return home


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory, sdk_home: Path) -> Iterator[Stack]:
    prefix = f"sfaisdk-{uuid.uuid4().hex[:10]}"
    s = Settings(redis_url=redis_url, key_prefix=prefix, data_dir=tmp_path_factory.mktemp("aisdk"),
                 api_keys={KEY: "acme"}, api_port=0, tenant_burst=1000, tenant_rate_per_s=1000.0)
    st = Stack(s, workers=1).start()
    try:
        yield st
    finally:
        st.stop()
        delete_keys(redis_url, f"{prefix}*")


def drive(home: Path, stack: Stack, case: str) -> dict[str, Any]:
    """run.mjs's line for `case`: what the SDK returned, and the requests it sent."""
    env = {**os.environ, "SETFLOW_URL": stack.api.url, "SETFLOW_KEY": KEY}
    run = subprocess.run(["node", "run.mjs", case], cwd=home, env=env, capture_output=True, text=True,
                         timeout=CASE_S)
    assert run.returncode == 0, run.stderr[-3000:]
    [line] = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    assert isinstance(line, dict)
    sent = [{k: r.get(k) for k in ("status", "error", "body")} for r in line["requests"]]
    assert line["ok"], f"{line['error']}\n{line.get('body')}\nsent: {json.dumps(sent)[-6000:]}"
    refused = [r for r in line["requests"] if r["status"] >= 400]
    assert not refused, refused
    return line


def answered(turn: dict[str, Any], args: dict[str, str], output: str) -> None:
    """One generateText/streamText call of the tool loop: a step that calls get_metric with
    `args` (the SDK runs it: `output`), then the answer, which states it as the output gives it."""
    calls, answer = turn["steps"]
    assert calls["finishReason"] == "tool-calls" and calls["toolCalls"] == [{"name": "get_metric", "input": args}]
    assert calls["toolResults"] == [output]
    assert answer["finishReason"] == "stop" and not answer["toolCalls"]
    assert turn["finishReason"] == "stop"
    assert turn["text"] == f"churn in APAC in {args['period']} was {output}.", turn["text"]


def responses(line: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["body"] for r in line["requests"] if r["url"].endswith("/v1/responses")]


@pytest.mark.parametrize("how", ["generate", "stream"])
def test_a_tool_loop_then_the_next_question_with_the_messages_re_sent(sdk_home: Path, stack: Stack,
                                                                      how: str) -> None:
    line = drive(sdk_home, stack, f"{how}-resent")
    answered(line["first"], FIRST, "2.7")
    answered(line["second"], SECOND, "2.5")
    assert line["calls"] == [FIRST, SECOND]
    if how == "stream":
        assert line["second"]["deltas"] == line["second"]["text"] and not line["second"]["errors"]
    bodies = responses(line)
    assert len(bodies) == 4 and not any("previous_response_id" in b for b in bodies)  # stateless: the history each time
    assert all(b.get("stream") is (True if how == "stream" else None) for b in bodies)


@pytest.mark.parametrize("how", ["generate", "stream"])
def test_a_tool_loop_then_the_next_question_with_previous_response_id(sdk_home: Path, stack: Stack,
                                                                      how: str) -> None:
    line = drive(sdk_home, stack, f"{how}-previous")
    answered(line["first"], FIRST, "2.7")
    answered(line["second"], SECOND, "2.5")
    if how == "stream":
        assert line["first"]["deltas"] == line["first"]["text"] and line["second"]["deltas"] == line["second"]["text"]
    # every step of the second loop names the first loop's answer; its last re-sends the call made since
    bodies = responses(line)
    assert [b.get("previous_response_id") for b in bodies] == [None, None, line["first"]["responseId"],
                                                                line["first"]["responseId"]]
    assert [x.get("type", "message") for x in bodies[3]["input"]] == ["message", "function_call",
                                                                      "function_call_output"]


@pytest.mark.parametrize("how", ["generate", "stream"])
def test_a_tool_loop_then_the_next_question_in_a_conversation(sdk_home: Path, stack: Stack, how: str) -> None:
    line = drive(sdk_home, stack, f"{how}-conversation")
    answered(line["first"], FIRST, "2.7")
    answered(line["second"], SECOND, "2.5")
    assert all(b["conversation"] == line["conversation"] for b in responses(line))
    items = httpx.get(f"{stack.api.url}/v1/conversations/{line['conversation']}/items?order=asc",
                      headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
    said = [(x["type"], x.get("role")) for x in items]
    # each question once: the SDK re-sends the question with the call's output (the call it leaves out)
    assert said == [("message", "user"), ("function_call", None), ("function_call_output", None),
                    ("message", "assistant")] * 2, said


@pytest.mark.parametrize("how", ["generate", "stream"])
def test_a_function_of_two_parameters_in_a_tool_loop(sdk_home: Path, stack: Stack, how: str) -> None:
    """get_weather(city, unit: c or f) declared with zod (issue 51): each call's arguments are
    what its question writes ("in °F", "in C"), the SDK runs it, and the answer quotes its
    output; the second question re-sent with the messages (generate) or after the first answer's
    response (stream)."""
    line = drive(sdk_home, stack, f"{how}-weather")
    assert line["calls"] == [{"city": "Paris", "unit": "f"}, {"city": "Lisbon", "unit": "c"}]
    for turn, output in ((line["first"], "72 and sunny"), (line["second"], "21")):
        calls, answer = turn["steps"]
        assert calls["finishReason"] == "tool-calls" and calls["toolResults"] == [output]
        assert answer["finishReason"] == "stop" and turn["text"] == f"The result is {output}.", turn["text"]
        if how == "stream":
            assert turn["deltas"] == turn["text"] and not turn["errors"]


def test_functions_of_no_string_in_a_tool_loop(sdk_home: Path, stack: Stack) -> None:
    """get_fibonacci(n: int) and compare_cities(cities: string[]) declared with zod (issue 51):
    "the 10th" is n, "Paris and Rome" the array; the SDK runs each and the answer quotes it."""
    line = drive(sdk_home, stack, "generate-nostring")
    assert line["calls"] == [{"n": 10}, {"cities": ["Paris", "Rome"]}]
    for turn, output in ((line["first"], "55"), (line["second"], "Rome is warmer")):
        calls, answer = turn["steps"]
        assert calls["finishReason"] == "tool-calls" and calls["toolResults"] == [output]
        assert answer["finishReason"] == "stop" and turn["text"] == f"The result is {output}.", turn["text"]
