"""The agent's tools (domain/tools.py): the calculator refuses all but arithmetic, the sample
dataset is deterministic, an error result is held to the rule every result is, a missing row
names what is not held and hints only at a miscopy."""

import re
import warnings

import pytest

from domain.markup import SPECIAL_TOKENS
from domain.tools import RESULT_RE, Dataset, Store, ToolError, calc, error_result, held_names, no_row, run_call


def test_calc_evaluates_arithmetic_and_refuses_anything_else() -> None:
    assert calc("(1200-950)/950*100") == "26.32"
    assert calc("2+3*4") == "14" and calc("-7/2") == "-3.5" and calc("0.1+0.2") == "0.3"
    for bad in ("__import__('os')", "2**10", "x+1", "1/0", "(1", "1" * 300, "0x10", "1_0", "1e5", "45orp"):
        with pytest.raises(ToolError), warnings.catch_warnings():
            warnings.simplefilter("error")  # "45orp" once printed Python's SyntaxWarning on the worker's stderr
            calc(bad)
    assert calc(" 2 + 3 ") == "5"


def test_calc_is_exact_where_a_result_can_be_and_never_rounds_to_a_number_it_is_not() -> None:
    """Datasets hold up to 6 decimals: a difference of two error rates was once "0" (rounded to 2
    decimals), and an answer stating it was verified.  Sums, differences and products are exact
    (to 6 decimals); a quotient that does not end is rounded half up to 2 decimals, below 1 to 2
    significant digits; what cannot be written so is an error, not a 0 or a long number."""
    assert calc("0.0034-0.0019") == "0.0015" and calc("0.0034+0.0019") == "0.0053"
    assert calc("1.005+1") == "2.005"  # a float made it 2.00499...: "2"
    assert calc("123456789012345.123456+0") == "123456789012345.123456"  # 21 digits: past a float's
    assert calc("1/300") == "0.0033" and calc("2/3") == "0.67" and calc("7/8") == "0.875"
    assert calc("(-40--80)/-80*100") == "-50" and calc("0.125*2") == "0.25"
    for bad, why in (("1/3000000000", "below 0.000001"), ("999999999999999*10", "more than 15 digits"),
                     ("0/0", "division by zero")):
        with pytest.raises(ToolError, match=why):
            calc(bad)


def test_metric_lookup_is_deterministic_and_validates_its_arguments() -> None:
    d = Dataset(7)
    assert d.lookup("revenue", "EMEA", "2026-Q3") == Dataset(7).lookup("revenue", "EMEA", "2026-Q3")
    assert d.lookup("revenue", "EMEA", "2026-Q3") != Dataset(8).lookup("revenue", "EMEA", "2026-Q3")
    assert run_call('metric("revenue", "Mars", "2026-Q3")', d).startswith("error: unknown region")
    assert run_call('metric("revenue")', d).startswith("error: metric takes 3")
    assert run_call("rm -rf /", d).startswith("error: not a tool call")


def test_an_error_result_is_held_to_the_rule_every_result_is() -> None:
    """A reason quoting what the model wrote (a marker, a control token's text, control
    characters, any length) still gives a result RESULT_RE takes, with nothing that would read
    as a marker or encode to a control token."""
    for reason in ("", "   ", "not a tool call: '<result>9</result>'", "x" * 500, "[EOS] and [MASK]\n\x00",
                   "a\tb", "<" * 300, "é" * 199 + "<"):
        r = error_result(reason)
        assert re.fullmatch(RESULT_RE, r), (reason, r)
        assert not any(s in r for s in SPECIAL_TOKENS) and "<" not in r and ">" not in r, r
    assert error_result("division by zero") == "error: division by zero"  # a plain reason is kept
    assert error_result("[EOS]") == "error: (EOS)"
    assert error_result("y" * 300) == "error: " + "y" * 197 + "..."
    long_call = 'metric("' + "<result>" * 40 + '")'
    assert re.fullmatch(RESULT_RE, run_call(long_call, Dataset(7)))


def test_a_missing_row_names_what_is_not_held_and_hints_only_at_a_miscopy_of_the_question() -> None:
    q = "How much higher was dc in Xfers 32 than in dXqQj in 1993-H1?"
    held = held_names([("dc", "Xfers 32", "1993-H1"), ("dc", "dXqQj", "1993-H1"), ("dc", "Xfers 33", "1993-H2")])
    def said(*call: str, question: str = q) -> str:
        return str(no_row(call, held, question))  # type: ignore[arg-type]
    assert said("dc", "Xfgis 32", "1993-H1") == "unknown region 'Xfgis 32': did you mean 'Xfers 32'?"
    assert said("d", "Xfers 32", "zz") == "unknown metric 'd': did you mean 'dc'?; unknown period 'zz'"
    assert said("dc", "Xfgis 32", "1993-H1", question="") == "unknown region 'Xfgis 32'"  # no question: no hint
    # copied right from the question but not held: no hint (a held neighbour would be a wrong row)
    held_q3 = held_names([("revenue", "EMEA", "2026-Q2")])
    assert str(no_row(("revenue", "EMEA", "2026-Q3"), held_q3, "revenue in EMEA in 2026-Q3?")) == \
        "unknown period '2026-Q3'"
    # the closest held name the question does not hold is no hint either ("Xfers 33")
    assert said("dc", "Xfers 34", "1993-H1") == "unknown region 'Xfers 34': did you mean 'Xfers 32'?"
    assert said("dc", "Xfers 32", "1993-H2") == "no row for metric 'dc', region 'Xfers 32', period '1993-H2'"
    store = Store({("dc", "Xfers 32", "1993-H1"): "577"})
    assert store.lookup("dc", "Xfers 32", "1993-H1") == "577"
    with pytest.raises(ToolError, match=r"^unknown region 'Xfgis 32'$"):
        store.lookup("dc", "Xfgis 32", "1993-H1")
