"""The shipped checkpoint: loads, and does its jobs on fixed inputs with W = 1 (AR) and with set
decoding (greedy): a fully correct narrative (every name, number, direction and comparison of
the payload), a correct tool call and final answer, a template filled by infill.  Rates over
many held-out inputs are the quality benchmark's business (bench/quality.py, docs/BENCHMARKS.md);
these fixed inputs pin that the shipped file is the trained model and that the workflows drive
it correctly.
"""

import random

import pytest

from domain import agent, answers, narrative, report
from domain.draws import make_payload
from domain.payload import Breakdown, Metric, Payload
from domain.tools import Dataset, calc, call_text
from model import checkpoint, shipped
from model.config import ModelConfig
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.jobs.params import ParamsSpec
from runtime.jobs.payload import PayloadSpec
from runtime.jobs.specs import AgentSpec, NarrativeSpec
from runtime.sessions.local import LocalTurns
from workflows import agent as agent_flow
from workflows import narrative as narrative_flow
from workflows import report as report_flow
from workflows.turn import decode_params

PAYLOAD = Payload(
    "Globex", "2026-Q3", "brief",
    [Metric("revenue", "1240", "1105", "1300"), Metric("churn", "2.4", "2.6")],
    Breakdown("region", "revenue", [("EMEA", "400", "380"), ("APAC", "300", "310")]))
QUESTION = "By how much did revenue in EMEA change from 2026-Q2 to 2026-Q3, in percent?"
DATA = Dataset(2026)
V1, V2 = DATA.lookup("revenue", "EMEA", "2026-Q2"), DATA.lookup("revenue", "EMEA", "2026-Q3")
TASK = agent.Task(QUESTION, [call_text("metric", "revenue", "EMEA", "2026-Q2"),
                             call_text("metric", "revenue", "EMEA", "2026-Q3"),
                             call_text("calc", f"({V2}-{V1})/{V1}*100")],
                  calc(f"({V2}-{V1})/{V1}*100"), "")
PARAMS = {"ar": ParamsSpec(policy="ar", window=1, tau=None, max_new_tokens=200),
          "set": ParamsSpec(policy="set", window=4, tau=0.9, max_new_tokens=200),
          "prefix": ParamsSpec(policy="prefix", window=8, tau=0.99, max_new_tokens=200)}


@pytest.fixture(scope="module")
def loaded() -> tuple[SetDLM, Tokenizer]:
    return shipped.load()


def test_the_shipped_checkpoint_is_small_and_complete(loaded: tuple[SetDLM, Tokenizer]) -> None:
    model, tok = loaded
    files = {p.name for p in shipped.SHIPPED.iterdir()}
    assert files == {checkpoint.WEIGHTS, checkpoint.CONFIG, checkpoint.TOKENIZER}
    assert sum(p.stat().st_size for p in shipped.SHIPPED.iterdir()) <= 25 * 2**20
    assert model.cfg == ModelConfig.from_name("small") and tok.vocab_size <= model.cfg.vocab_size


@pytest.mark.parametrize("policy", ["ar", "set", "prefix"])
def test_a_fully_correct_narrative(loaded: tuple[SetDLM, Tokenizer], policy: str) -> None:
    spec = NarrativeSpec(payload=PayloadSpec.of(PAYLOAD), params=PARAMS[policy])
    r = narrative_flow.run(LocalTurns(*loaded), spec)
    # the job returns the text with its facts written out; the checker reads slot form
    rendered = PAYLOAD.render()
    c = narrative.read_back(rendered, rendered.slots.delexicalise(r["text"]))
    assert c.fully_correct and r["text"].endswith("."), (c.problems, r["text"])
    if policy != "ar":  # parallel decoding: fewer forwards than tokens
        assert r["nfe"] - 1 < r["tokens"]


@pytest.mark.parametrize("policy", ["ar", "set"])
def test_a_correct_tool_call_and_answer(loaded: tuple[SetDLM, Tokenizer], policy: str) -> None:
    spec = AgentSpec(question=QUESTION, dataset_seed=DATA.seed,
                     params=PARAMS[policy].model_copy(update={"max_new_tokens": 96}))
    r = agent_flow.run(LocalTurns(*loaded), spec)
    c = answers.check(TASK, r["text"])
    assert r["finished"] and c.tool_call_ok and c.answer_ok, r["text"]


@pytest.mark.parametrize("policy", ["ar", "set"])
def test_a_template_filled_by_infill(loaded: tuple[SetDLM, Tokenizer], policy: str) -> None:
    payload = make_payload(random.Random("smoke"))
    payload.breakdown = None
    t = report.template(payload)  # in slot form: the runtime writes its facts out
    r = report_flow.figures(LocalTurns(*loaded), payload, decode_params(PARAMS[policy]))
    assert r["exact"] and r["markdown"] == t.rendered.slots.lexicalise(t.text()), r["markdown"]
