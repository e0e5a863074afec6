"""runtime/sessions/store.py (a manifest's state): what a turn's row and its manifest keep of its parameters."""

from __future__ import annotations

from model.params import DecodeParams
from runtime.jobs.params import ParamsSpec
from runtime.sessions.store import params_json


def test_a_turns_params_are_kept_whole() -> None:
    """Every field a request can give is kept (not 6 of 10), and reads back equal."""
    p = DecodeParams(policy="prefix", window=8, tau=0.99, max_new_tokens=5, temperature=0.5, seed=3, stop=[[7, 8]],
                     ignore_eos=True)
    assert DecodeParams(**params_json(p)) == p
    assert set(params_json(p)) >= set(ParamsSpec.model_fields)
