"""Grammar engines side by side: llguidance and xgrammar on the same JSON schemas and the same
token sequences.  For each schema (SCHEMAS: flat, nested, arrays, enums, bounded numbers,
optional fields, growing in size) and each tokenizer, a valid document (its EXAMPLE) is tokenized
and walked token by token: before each token the engine fills the next-token mask (timed), then
consumes the token.  Reports the compile time, and the mask time per token at p50 and p99: cold
(a schema's first document: llguidance fills its lexer lazily, xgrammar precomputed its masks at
compile time) and warm (the same schema's later documents).  One thread: each engine computes a
mask on the calling thread.

Tokenizers: the shipped model's (model/shipped/tokenizer.json), and, with --big FILE, a large
byte-level BPE vocabulary (a tokenizers JSON file).  Prints one JSON object as its last line.

    python bench/grammars.py [--big FILE] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).resolve().parent.parent / "model" / "shipped" / "tokenizer.json"

#: the benchmark's schemas, in growing size, each with a valid document
SCHEMAS: dict[str, dict[str, Any]] = {
    "flat": {"type": "object", "properties": {"name": {"type": "string"}, "count": {"type": "integer"},
                                              "ok": {"type": "boolean"}},
             "required": ["name", "count", "ok"], "additionalProperties": False},
    "enum": {"type": "object", "properties": {
        "region": {"type": "string", "enum": ["AMER", "EMEA", "APAC", "LATAM"]},
        "direction": {"type": "string", "enum": ["up", "down", "flat"]}},
        "required": ["region", "direction"], "additionalProperties": False},
    "bounded": {"type": "object", "properties": {
        "share": {"type": "number", "minimum": 0, "maximum": 1},
        "rank": {"type": "integer", "minimum": 1, "maximum": 10}},
        "required": ["share", "rank"], "additionalProperties": False},
    "optional": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40}, "note": {"type": "string"},
        "score": {"type": "number"}},
        "required": ["title"], "additionalProperties": False},
    "array": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 4},
        "values": {"type": "array", "items": {"type": "number"}, "maxItems": 6}},
        "required": ["tags", "values"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "metric": {"type": "string"},
        "period": {"type": "object", "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
                   "required": ["from", "to"], "additionalProperties": False},
        "rows": {"type": "array", "maxItems": 3, "items": {
            "type": "object", "properties": {
                "name": {"type": "string", "maxLength": 24},
                "value": {"type": "number"},
                "change": {"type": "string", "enum": ["up", "down", "flat"]}},
            "required": ["name", "value", "change"], "additionalProperties": False}},
        "summary": {"type": "string", "maxLength": 120}},
        "required": ["metric", "period", "rows", "summary"], "additionalProperties": False},
}
EXAMPLES: dict[str, Any] = {
    "flat": {"name": "revenue", "count": 12, "ok": True},
    "enum": {"region": "APAC", "direction": "down"},
    "bounded": {"share": 0.25, "rank": 3},
    "optional": {"title": "Quarterly churn", "score": 4.5},
    "array": {"tags": ["sales", "q3"], "values": [1.5, 2, 30.25]},
    "nested": {"metric": "revenue", "period": {"from": "2025-Q4", "to": "2026-Q1"},
               "rows": [{"name": "AMER", "value": 812.25, "change": "up"},
                        {"name": "EMEA", "value": 640, "change": "down"}],
               "summary": "Revenue rose in AMER and fell in EMEA."},
}
SEPARATORS = (",", ":")  # compact documents: no whitespace between tokens of the grammar


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


class Llg:
    """llguidance: a schema's matcher built once (its lexer filled lazily as masks are asked);
    each walk a deep copy of it (what a response gets from the process's cache)."""

    def __init__(self, tok_json: str, n_vocab: int, eos: int) -> None:
        import llguidance
        import llguidance.numpy as lnp

        self.llg, self.lnp, self.n, self.eos = llguidance, lnp, n_vocab, eos
        self.tok = llguidance.LLTokenizer(tok_json, n_vocab=n_vocab, eos_token=eos)

    def compile(self, schema: dict[str, Any]) -> Any:
        opts = {"whitespace_flexible": False, "item_separator": SEPARATORS[0], "key_separator": SEPARATORS[1]}
        m = self.llg.LLMatcher(self.tok, self.llg.LLMatcher.grammar_from_json_schema(schema, defaults=opts))
        assert not m.is_error(), m.get_error()
        return m

    def walk(self, compiled: Any, ids: list[int]) -> list[float]:
        m, bm = compiled.deep_copy(), self.lnp.allocate_token_bitmask(1, self.n)
        times = []
        for t in ids + [self.eos]:
            t0 = time.perf_counter()
            self.lnp.fill_next_token_bitmask(m, bm, 0)
            times.append(time.perf_counter() - t0)
            assert (int(bm[0, t // 32]) >> (t % 32)) & 1, f"llguidance refuses a valid document's token {t}"
            assert m.consume_token(t), m.get_error()
        return times


class Xgr:
    """xgrammar: a schema compiled once (its token masks precomputed per grammar state, the
    compiler's work); each walk a new matcher over it."""

    def __init__(self, tok_json: str, n_vocab: int, eos: int) -> None:
        import tokenizers
        import xgrammar
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer.from_str(tok_json))
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=n_vocab, stop_token_ids=[eos])
        self.xgr, self.n, self.eos = xgrammar, n_vocab, eos
        self.comp = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.comp.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=SEPARATORS)

    def walk(self, compiled: Any, ids: list[int]) -> list[float]:
        m, bm = self.xgr.GrammarMatcher(compiled), self.xgr.allocate_token_bitmask(1, self.n)
        times = []
        for t in ids + [self.eos]:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(bm, 0)
            times.append(time.perf_counter() - t0)
            assert (int(bm[0, t // 32]) >> (t % 32)) & 1, f"xgrammar refuses a valid document's token {t}"
            assert m.accept_token(t)
        return times


def vocabulary(path: Path) -> tuple[str, int, int, Any]:
    """A tokenizers JSON file -> its text, its number of ids, its EOS id and the tokenizer."""
    from tokenizers import Tokenizer as HF

    text = path.read_text()
    hf = HF.from_str(text)
    n = hf.get_vocab_size(with_added_tokens=True)
    eos = next(hf.token_to_id(s) for s in ("[EOS]", "<|endoftext|>", "</s>") if hf.token_to_id(s) is not None)
    return text, n, eos, hf


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--big", type=Path, default=None, help="a large tokenizers JSON vocabulary")
    ap.add_argument("--repeat", type=int, default=3, help="walks of each document (the times pooled)")
    args = ap.parse_args(argv)
    vocabs = {"shipped": SHIPPED} | ({"big": args.big} if args.big else {})
    out: dict[str, Any] = {"bench": "grammars", "rows": []}
    for vname, path in vocabs.items():
        text, n, eos, hf = vocabulary(path)
        for engine, cls in (("llguidance", Llg), ("xgrammar", Xgr)):
            e = cls(text, n, eos)
            cold, warm, compiles, per_doc = [], [], [], []
            for name, schema in SCHEMAS.items():
                ids = hf.encode(json.dumps(EXAMPLES[name], separators=SEPARATORS), add_special_tokens=False).ids
                for _ in range(args.repeat):  # a schema first seen: compile, then its first walk
                    t0 = time.perf_counter()
                    compiled = e.compile(schema)
                    compiles.append(time.perf_counter() - t0)
                    ts = e.walk(compiled, ids)
                    cold += ts
                    per_doc.append(compiles[-1] + sum(ts))
                for _ in range(args.repeat):  # the same schema again: compiled and warm
                    warm += e.walk(compiled, ids)
            row = {"vocab": vname, "n_vocab": n, "engine": engine, "masks": len(cold),
                   "cold_mask_us_p50": round(pct(cold, 0.5) * 1e6, 1), "cold_mask_us_p99": round(pct(cold, 0.99) * 1e6, 1),
                   "warm_mask_us_p50": round(pct(warm, 0.5) * 1e6, 1), "warm_mask_us_p99": round(pct(warm, 0.99) * 1e6, 1),
                   "compile_ms_p50": round(pct(compiles, 0.5) * 1e3, 2), "compile_ms_max": round(max(compiles) * 1e3, 2),
                   "first_document_ms_p50": round(pct(per_doc, 0.5) * 1e3, 2)}
            print(json.dumps(row), flush=True)
            out["rows"].append(row)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
