"""Report sections and templates: deterministic, self-checking, holes are whole tokens."""

import random

from domain import report
from model.tokenizer import Tokenizer


def test_sections_pass_their_checker_and_a_wrong_heading_fails() -> None:
    for i in range(300):
        s, text = report.section_example(random.Random(i))
        assert report.check_section(s, text).fully_correct, text
        assert s.prompt_text() == report.section_example(random.Random(i))[0].prompt_text()
    s, text = report.section_example(random.Random(0))
    assert not report.check_section(s, text.replace("## ", "## Not ", 1)).fully_correct


def test_templates_fill_back_to_a_correct_text() -> None:
    for i in range(300):
        t = report.make_template(random.Random(i))
        assert t.answers and t.text(hole="<hole>").count("<hole>") == len(t.answers)
        filled = t.text()
        for c in t.rendered.metrics:
            assert f"{c.name}: {c.value} {c.unit} (" in filled
        written = t.rendered.slots.lexicalise(filled)
        assert all(len(a) == len("[F1]") or a.startswith("[F") or a in ("up", "down", "flat", "above", "below", "on")
                   for a in t.answers) and "[F" not in written


def test_infill_holes_are_whole_tokens(tok: Tokenizer) -> None:
    for i in range(50):
        t = report.make_template(random.Random(i))
        ids, hole = report.infill_tokens(tok, t)
        runs, cur = [], []
        for x, h in zip(ids, hole):
            if h:
                cur.append(x)
            elif cur:
                runs.append(cur)
                cur = []
        assert [tok.decode(r) for r in runs] == t.answers
