"""A mixed fleet of real worker processes behind the real API: the shipped model in float32, the
shipped model in bfloat16 (on the CPU: numerics of its own) and an imported released-layout
checkpoint (a Qwen-style tokenizer: BOS = EOS, the mask id past 150k).  Each job runs on a
worker that hosts its session's model and numerics, and only there; a turn and a narrative job
run end to end on the imported model, an agent job runs there until it fails with no answer
(random weights); a model or numerics nobody hosts is refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from model.importer import import_checkpoint
from runtime.api.app import create_app
from tests.model.released import ENDOFTEXT, MASK, qwen3_state, write_release
from tests.workers.conftest import make_cluster
from tests.workflows.test_narrative import PAYLOAD
from workers.celery_app import sender
from workers.local import LocalCluster

KEY = {"Authorization": "Bearer key-fleet-0001"}


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, TestClient, str]]:
    tmp = tmp_path_factory.mktemp("fleet")
    imported = import_checkpoint(write_release("hf_safetensors", qwen3_state(seed=9), tmp / "src"), tmp / "qwen")
    c = make_cluster(redis_url, tmp / "cluster", api_keys={"key-fleet-0001": "acme"})
    try:
        c.start("fp32")
        c.start("bf16", dtype="bfloat16")
        c.start("qwen", model_dir=str(tmp / "qwen"))
        c.ready("fp32", "bf16", "qwen", timeout_s=120)
        app = create_app(c.settings, client=c.client, send=sender(c.app))
        with TestClient(app) as http:
            yield c, http, imported.config.name
    finally:
        c.close()


def _run(c: LocalCluster, http: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/v1/jobs", headers=KEY, json=body)
    assert r.status_code == 202, r.text
    done = c.wait(r.json()["id"], 120)
    assert done.status == "succeeded", (done.error, c.log("qwen"))
    assert done.result is not None
    return {**done.result, "session": done.session_id}


def test_each_job_runs_where_its_model_and_numerics_are_hosted(fleet: tuple[LocalCluster, TestClient, str]) -> None:
    c, http, qwen = fleet
    turn = {"text": "company: Acme\n", "params": {"max_new_tokens": 6}}
    for ask, worker in (({}, "fp32"), ({"numerics": "cpu/bfloat16"}, "bf16"), ({"model": qwen}, "qwen")):
        first = _run(c, http, {"kind": "turn", "spec": turn, **ask})
        assert first["worker"] == worker, (ask, first)
        again = _run(c, http, {"kind": "turn", "spec": turn, "session": first["session"]})  # the session's binding
        assert again["worker"] == worker and again["path"] == "warm"
        rec = c.records.get_session(first["session"], "acme")
        assert (rec.model, rec.numerics) == ((qwen if worker == "qwen" else "small"),
                                             "cpu/bfloat16" if worker == "bf16" else "cpu/float32")
    for ask in ({"model": "llama"}, {"numerics": "cuda/bfloat16"}, {"model": qwen, "numerics": "cpu/bfloat16"}):
        r = http.post("/v1/jobs", headers=KEY, json={"kind": "turn", "spec": turn, **ask})
        assert r.status_code == 409 and r.json()["error"]["code"] == "model_not_hosted", (ask, r.text)


def test_a_turn_a_narrative_and_an_agent_run_end_to_end_on_the_imported_model(
        fleet: tuple[LocalCluster, TestClient, str]) -> None:
    c, http, qwen = fleet
    t = _run(c, http, {"kind": "turn", "model": qwen, "spec": {"text": "the theory", "params": {
        "policy": "set", "window": 4, "tau": 0.5, "max_new_tokens": 12}}})
    assert t["worker"] == "qwen" and 0 < len(t["tokens"]) <= 12 and MASK not in t["tokens"]
    payload = {"tenant": PAYLOAD.tenant, "period": PAYLOAD.period, "style": PAYLOAD.style,
               "metrics": [{"key": m.key, "value": m.value, "prev": m.prev, **({"target": m.target} if m.target else {})}
                           for m in PAYLOAD.metrics]}
    n = _run(c, http, {"kind": "narrative", "model": qwen, "spec": {
        "payload": payload, "allow_unverified": True, "params": {"policy": "prefix", "window": 8, "tau": 0.9,
                                                                 "max_new_tokens": 16}}})
    assert n["worker"] == "qwen" and isinstance(n["text"], str)  # random weights: noise, flagged, the job completes
    # random weights never answer: the agent job runs there, then fails no_answer (allow_unverified
    # takes back a wrong answer, never a missing one)
    r = http.post("/v1/jobs", headers=KEY, json={"kind": "agent", "model": qwen, "spec": {
        "question": "What is 2 + 2?", "max_calls": 1, "allow_unverified": True,
        "params": {"policy": "set", "window": 4, "tau": 0.5, "max_new_tokens": 16}}})
    assert r.status_code == 202, r.text
    a = c.wait(r.json()["id"], 120)
    assert a.worker == "qwen" and a.status == "failed", (a.status, a.error, c.log("qwen"))
    assert a.error is not None and a.error["code"] == "no_answer", a.error
    # the session's transcript reads back through the API with the imported model's tokenizer
    s = http.get(f"/v1/sessions/{t['session']}", headers=KEY).json()
    assert s["turns"][0]["tokens"] > 0 and s["turns"][0]["input"] == "the theory"
    assert ENDOFTEXT not in t["tokens"][:-1]
