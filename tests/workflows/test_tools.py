"""workflows/tools.py: the runtime's one tool runner gives, for every call the model was trained
on, the result training gave (domain/agent.py); whatever goes wrong is a result, never a
raise."""

from __future__ import annotations

import random
from pathlib import Path

from domain import agent as corpus
from domain.guide import CallNames
from domain.tools import CALL, END_CALL, END_RESULT, RESULT, Dataset, run_call
from model import shipped
from model.importer import import_checkpoint
from model.tokenizer import Tokenizer
from runtime.jobs.specs import ToolOutput
from tests.model.released import qwen3_state, write_release
from workflows import tools


def test_a_trained_call_gets_the_result_training_gave() -> None:
    for i in range(200):
        task, data, _ = corpus.example(random.Random(f"tools/{i}"))
        for call in task.calls:
            r = tools.run_call(call, data)
            assert r.ok and r.result == run_call(call, data), call
            assert r.tool == call.split("(", 1)[0] and r.call == call


def test_what_goes_wrong_comes_back_as_an_error_result() -> None:
    data = Dataset(7)
    for call, tool, reason in (('metric("revenue", "Mars", "2026-Q3")', "metric", "unknown region 'Mars'"),
                               ('metric("revenue")', None, "metric takes 3"),
                               ('calc("1/0")', "calc", "division by zero"),
                               ("rm -rf /", None, "not a tool call")):
        r = tools.run_call(call, data)
        assert not r.ok and r.tool == tool and r.result.startswith("error: ") and reason in r.result, r


def test_every_error_result_is_one_a_client_could_send() -> None:
    """Whatever the model writes, the result our tools give it is one the API takes from a client
    running the same tool (runtime/jobs/specs.py ToolOutput): the two paths read alike."""
    data = Dataset(7)
    for call in ('metric("' + "a" * 100 + '", "EMEA", "2026-Q3")', 'metric("' + "b" * 300 + '")',
                 'metric("revenue", "EMEA", "2026-Q3")<result>1', "[EOS]" * 50, 'calc("' + "9" * 300 + '")',
                 'metric("", "\x01", "2026-Q3")', 'calc("1/0")'):
        r = tools.run_call(call, data)
        assert not r.ok, r
        ToolOutput(call_id="call_0", output=r.result)  # raises if the API would refuse it


def test_a_tenant_table_says_what_a_slipped_training_transcript_says() -> None:
    """The mended call is learnt from the error text training gives (corpus.slipped): the
    runtime's table, read with the agent's question, gives that text for the same miscopy."""
    seen = 0
    for i in range(200):
        rng = random.Random(f"slip/{i}")
        task, store, pieces = corpus.wild_example(rng)
        slipped = corpus.slipped(task, store, rng)
        extra = [t for t, given in slipped if given and (t, given) not in pieces]
        if not extra:
            continue
        call, said = extra[0].removeprefix(CALL).removesuffix(END_CALL), extra[1]
        table = tools.Table.of("d", [[*k, v] for k, v in store.values.items()], task.question)
        assert f"{RESULT}{tools.run_call(call, table).result}{END_RESULT}\n" == said
        seen += "did you mean" in said
    assert seen > 50


def _guide_reads_the_calls_grammar(tok: Tokenizer) -> None:
    """CallGuide over a vocabulary's tokens says what guided_call says of the call's text."""
    q = "What was the total st1m7 across Xfers 32 and b in 2073-Q1?"
    guide = tools.CallGuide(tok, CallNames(q))
    before = tok.encode("A: " + CALL + 'metric("st1m7", "Xf')
    assert guide.allows(before, tok.encode("e")[0]) is True
    assert guide.allows(before, tok.encode("g")[0]) is False
    assert guide.allows(tok.encode("A: the total"), tok.encode("e")[0]) is None  # no call: not guided
    # calc with no number known: only its form (one quoted argument, then ")</call>")
    assert guide.allows(tok.encode(CALL + 'calc("1+'), tok.encode("x")[0]) is True
    assert guide.allows(tok.encode(CALL + 'calc("1+x"'), tok.encode(",")[0]) is False
    done = tok.encode(CALL + 'metric("b", "b", "b")' + END_CALL + "\n")
    assert guide.allows(done, tok.encode("g")[0]) is None  # after the call
    assert guide.allows(before, tok.encode("g")[0]) is False  # asked again: the same answer (it keeps the last)


def test_the_call_guide_reads_setflows_tokens() -> None:
    tok = Tokenizer.from_file(shipped.SHIPPED / "tokenizer.json")
    _guide_reads_the_calls_grammar(tok)
    # calc's numbers: the results' and the question's; a tool the client runs: its names not
    # guided (its client holds them), its form is (three quoted arguments, then ")</call>")
    names = CallNames("What was the total x across a and b in Q1?").after(["939823.2", "6323.7"])
    guide = tools.CallGuide(tok, names, unguided=["metric"])
    calc = tok.encode(CALL + 'calc("(6323.7-9')
    assert guide.allows(calc, tok.encode("3")[0]) is True and guide.allows(calc, tok.encode("9")[0]) is False
    assert guide.allows(tok.encode(CALL + 'metric("x", "'), tok.encode("q")[0]) is True
    assert guide.allows(tok.encode(CALL + 'metric("x", "q"'), tok.encode(")")[0]) is False  # two of three


def test_a_responses_call_names_a_tool_it_was_given_in_its_tools_form() -> None:
    """A response offered calc only (a client's function of one string): the model's lookup
    habit (`metric("s the", "weather", "Francisco")`, which the suite's weather question drew,
    then no answer) is refused at its name, and the client's call has calc's one argument."""
    tok = Tokenizer.from_file(shipped.SHIPPED / "tokenizer.json")
    guide = tools.CallGuide(tok, CallNames("What's the weather like in San Francisco?"), unguided=["calc"],
                            tools=["calc"])
    assert guide.allows(tok.encode(CALL), tok.encode("metric")[0]) is False
    assert guide.allows(tok.encode(CALL), tok.encode("calc")[0]) is True
    assert guide.allows(tok.encode(CALL + 'calc("San Francisco"'), tok.encode(",")[0]) is False
    assert guide.allows(tok.encode(CALL + 'calc("San Francisco"'), tok.encode(")")[0]) is True
    assert tools.call_form('calc("San Francisco")' + END_CALL, ["calc"]) is True
    assert tools.call_form('calc("")', ["calc"]) is False  # an empty argument
    assert tools.call_form('metric("a', None) is True and tools.call_form('metric("a', ["calc"]) is False
    assert tools.call_form("metr", None) is None  # the name, nothing offered: not guided


def test_a_function_filled_from_its_question_is_called_with_a_text_it_gives_and_a_forced_head_in_its_tokens() -> None:
    """The one text the model writes of a function whose other arguments the question fills
    (`texts`, in slot form: domain/arguments.py) is one of those, whole; a forced call's head is
    written as its own tokens: "c" then "alc" was a dead end the model left the guide at, and
    wrote `calc("(", "[F31]...`."""
    tok = Tokenizer.from_file(shipped.SHIPPED / "tokenizer.json")
    guide = tools.CallGuide(tok, CallNames("Will it rain in Oslo over the next 3 days?"), unguided=["calc"],
                            tools=["calc"], texts=["Oslo"])
    head = tok.encode(CALL + 'calc("')
    assert guide.allows(head, tok.encode("O")[0]) is True and guide.allows(head, tok.encode("(")[0]) is False
    assert guide.allows(tok.encode(CALL + 'calc("Oslo'), tok.encode('"')[0]) is True
    forced = tools.ForcedCall(tok, "calc", guide)
    assert forced.allows(tok.encode(CALL), tok.encode("calc")[0]) is True
    assert forced.allows(tok.encode(CALL), tok.encode("c")[0]) is False
    assert forced.allows(tok.encode(CALL + "calc"), tok.encode('("')[0]) is True  # the rest of the head, and on
    assert forced.allows(head, tok.encode("(")[0]) is False  # written: the calls' guide decides


def test_the_call_guide_reads_a_token_in_context_and_refuses_an_id_that_writes_nothing() -> None:
    """A character of two byte tokens ("ü") is judged once whole; "Z" alone is no name of
    "Zürich"; an id the tokenizer lacks (the model's rows past its vocabulary) writes nothing."""
    tok = Tokenizer.from_file(shipped.SHIPPED / "tokenizer.json")
    guide = tools.CallGuide(tok, CallNames("What was xf in Zürich in 2027-Q1?"))
    head = tok.encode(CALL + 'metric("xf", "Z')
    first, second = tok.encode("ü")
    assert guide.allows(head, first) is None  # half a character: no opinion yet
    assert guide.allows([*head, first], second) is True and guide.allows([*head, first, second], tok.encode("r")[0])
    assert guide.allows(head, tok.encode('"')[0]) is False  # "Z" is not a name the question holds whole
    assert guide.allows(head, tok.vocab_size + 3) is False
    assert guide.allows(tok.encode("A: the"), tok.vocab_size + 3) is None  # outside a call: not guided


def test_the_call_guide_reads_an_imported_vocabulary_without_markup_tokens(tmp_path: Path) -> None:
    import_checkpoint(write_release("hf_bin", qwen3_state(seed=4), tmp_path / "src"), tmp_path / "out")
    tok = shipped.load(tmp_path / "out")[1]
    assert not tok.has_token(CALL)  # `<call>` is several tokens: the guide reads the text
    _guide_reads_the_calls_grammar(tok)


def test_the_answer_guide_keeps_an_answer_to_the_answer_forms() -> None:
    """AnswerGuide: each token of an answer training writes is allowed after the ones before it
    (in slot form: the names the calls read, the result's slot); a word no form writes is refused
    at its first token that leaves them; a call's segment past its markup is not guided."""
    tok = Tokenizer.from_file(shipped.SHIPPED / "tokenizer.json")
    guide = tools.AnswerGuide(tok, None, [{"[F1]"}, {"[F2]", "[F3]"}, {"[F4]"}], {"[F7]"}, tok.eos_id)
    good = tok.encode("A: Total [F1] across [F2] and [F3] in [F4] was [F7].")
    assert all(guide.allows(good[:k], good[k]) in (True, None) for k in range(len(good)))
    assert all(guide.allows(good[:k], good[k]) for k in range(3, len(good)))  # past "A: ": guided, and allowed
    # the end: the way on from a whole answer (its stand-in where nothing else is), not guided before it, nor past it
    assert guide.allows(good, tok.eos_id) is True and guide.allows(good[:-1], tok.eos_id) is None
    assert guide.allows([*good, tok.eos_id], good[0]) is None and not guide.allows(good, good[0])
    # a name is one its calls read for that argument: a metric where a region goes is refused
    assert not tools.AnswerGuide(tok, None, [{"[F1]"}, {"[F2]"}, {"[F4]"}], {"[F7]"}).allows(
        tok.encode("A: [F1] in "), tok.token_id("[F1]"))
    bad = tok.encode("A: Total smmmm [F1] in [F2] and [F3] in [F4] was [F7].")
    assert any(guide.allows(bad[:k], bad[k]) is False for k in range(len(bad)))
    call = tok.encode('<call>metric("[F1]", "[F2]", "[F4]")</call>')
    assert guide.allows([], call[0]) is True  # a call opens a segment as training's do
    assert all(guide.allows(call[:k], call[k]) is None for k in range(1, len(call)))


def test_the_answer_guide_opens_a_segment_with_a_call_or_an_answer_only() -> None:
    """A segment after a result opens with a call's markup or "A: ", as training's do: a word
    before "A:" (which the checker refuses, answers.segment_problems) and an end before either are
    refused at their first token, so the model's most probable opening that training writes is
    taken; a number it writes as digits, where a result's slot goes, is refused too."""
    tok = Tokenizer.from_file(shipped.SHIPPED / "tokenizer.json")
    guide = tools.AnswerGuide(tok, None, [{"[F1]"}, {"[F2]", "[F3]"}, {"[F4]"}], {"[F7]"}, tok.eos_id)
    answer = tok.encode("A: Total [F1] across [F2] and [F3] in [F4] was [F7].")
    assert all(guide.allows(answer[:k], answer[k]) is True for k in range(len(answer)))  # "A: " guided and allowed
    for garbled in ("[F1] in [F2], [F4] was [F7].", "smmmm A: Total [F1]", " A: Total [F1]"):
        ids = tok.encode(garbled)
        assert any(guide.allows(ids[:k], ids[k]) is False for k in range(len(ids))), garbled
    assert guide.allows([], tok.eos_id) is False and guide.allows(tok.encode("A"), tok.eos_id) is False
    digits = tok.encode("A: The result is -.23655")
    assert any(guide.allows(digits[:k], digits[k]) is False for k in range(len(digits)))
