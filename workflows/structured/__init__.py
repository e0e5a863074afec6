"""Structured output: a turn's text held to a JSON Schema.  The schema is checked at submission
(domain/formats.py problems: domain/schemas.py's limits, then the grammar engine's own),
compiled to a grammar (llguidance: torch-free, so the API checks with the engine the workers
decode with), and the turn is decoded under JsonGuide, whose next-token mask is the grammar's; the document it ends
with is read back and validated (document) before it is returned as a success.  The room: this
module (the workflow: a request's format, the document turn, the check), guide.py (JsonGuide's
masks), closing.py (the closing walk), grammars.py (a schema's grammar and the matchers kept),
lengths.py (a client's maxLength held by the guide), vocab.py (a tokenizer's llguidance twin).

What "completable" means here: a step commits a token only where the committed text, that
token included, is a prefix of some document the grammar accepts.  Under a guide, decoding
commits only the unbroken run from the leftmost open position (model/policy.py guided), each
token masked in order against the tokens really before it, so under every policy (ar, prefix,
set, block) this is a prefix mask.  Commits out of order under a grammar (a token right of an
open position, checked for completability with the gap left open) are not done here.

Knows nothing of the model's forward or of torch."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from domain import schemas
from domain.formats import ANY_OBJECT as ANY_OBJECT
from domain.formats import ITEMS_CAP as ITEMS_CAP
from domain.formats import LAYOUT as LAYOUT
from domain.formats import STRING_CAP as STRING_CAP
from domain.formats import Format as Format
from domain.formats import bounded as bounded
from domain.formats import grammar as grammar
from domain.formats import problems as problems
from model.params import DecodeParams
from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.errors import BadInput, Unfinished, Unverified
from workflows.structured.guide import NUMBER_CAP as NUMBER_CAP
from workflows.structured.guide import JsonGuide as JsonGuide
from workflows.turn import Turns, ended, text_of, turn_input


def requested(text: dict[str, Any] | None) -> Format | None:
    """A Responses request's `text` field -> the Format it asks for (None: text).  ValueError
    with the reason where its format is not one setflow writes."""
    return Format.of((text or {}).get("format"))


def planned(spec: dict[str, Any], text: dict[str, Any] | None) -> dict[str, Any]:
    """A response's job spec, refused (BadInput) where it asks for a JSON document from the
    agent (tools the model calls): a structured answer of the agent is not written yet."""
    if spec.get("mode") == "agent" and requested(text) is not None:
        raise BadInput("text.format json_schema and json_object are written for a response without tools the model "
                       "calls (setflow_metric, setflow_calc, a function it calls); drop the tools or the format")
    return spec


def document(text: str, fmt: Format, ended: bool) -> Any:
    """The turn's text as its document, checked: Unfinished where the turn stopped before the
    document closed (its token limit), Unverified where it is not valid against the schema
    (never returned as a success)."""
    if not ended:
        raise Unfinished("the output reached its token limit before its JSON document closed; "
                         "raise max_output_tokens or ask for a smaller document", [text[-200:]])
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise Unverified(f"the output is not a JSON document: {e}", [text[-200:]]) from None
    errors = [e.message for e in schemas.validator(fmt.schema).iter_errors(doc)]
    if errors:
        raise Unverified("the output's document is not valid against the schema", errors[:8])
    return doc


FORMAT_PROMPT = "Write it as one JSON document."  # the document turn's input after a job's text
DOCUMENT_TOKENS = 256  # the document turn's token limit (a Responses text's own); the job's if smaller
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def written(turns: Turns, fmt: Format, text: str, params: DecodeParams) -> Any:
    """A native job's document (its spec's `format`): one more turn on its session after the
    text it wrote (checked already), decoded under the format's grammar within DOCUMENT_TOKENS
    (or the job's smaller limit), then checked (document).  Its numbers are facts: each must be one the text
    states (Unverified where it is not, as an answer's is); its strings are not read back."""
    ids = turn_input(turns.profile, turns.tokenizer, FORMAT_PROMPT)
    params = replace(params, max_new_tokens=min(params.max_new_tokens, DOCUMENT_TOKENS))
    guide = JsonGuide(turns.tokenizer, turns.cfg.vocab_size, turns.cfg.eos_id, fmt, params.max_new_tokens)
    r = turns.turn(ids, replace(params, guide=guide), text=FORMAT_PROMPT)
    doc = document(text_of(turns, r.tokens), fmt, ended(turns, r.tokens))
    stated = {float(n) for n in NUMBER.findall(text.replace(",", ""))}
    unstated = [n for n in _numbers(doc) if float(n) not in stated]
    if unstated:
        raise Unverified("the document states a number its text does not", [f"{n} is not in the text" for n in unstated[:8]])
    return doc


def document_positions(fmt: dict[str, Any] | None, tok: Tokenizer, profile: Profile) -> int:
    """Positions a job's document turn appends at most (0: no format): its input and its limit."""
    return 0 if Format.of(fmt) is None else len(turn_input(profile, tok, FORMAT_PROMPT)) + DOCUMENT_TOKENS


def _numbers(doc: Any) -> list[int | float]:
    """Every number in a JSON document (not its booleans), in order."""
    if isinstance(doc, dict):
        return [n for v in doc.values() for n in _numbers(v)]
    if isinstance(doc, list):
        return [n for v in doc for n in _numbers(v)]
    return [doc] if isinstance(doc, (int, float)) and not isinstance(doc, bool) else []
